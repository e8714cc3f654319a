package cliflags

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestSingleDash(t *testing.T) {
	root := &cobra.Command{Use: "x"}
	root.Flags().String("data-dir", "", "")
	root.Flags().BoolP("verbose", "v", false, "")
	sub := &cobra.Command{Use: "enroll"}
	sub.Flags().String("api", "", "")
	root.AddCommand(sub)
	in := []string{"-data-dir", "d", "-data-dir=e", "--data-dir", "f", "-v", "enroll", "-api=h:1", "-n", "-5", "-unknown", "--", "-data-dir"}
	want := []string{"--data-dir", "d", "--data-dir=e", "--data-dir", "f", "-v", "enroll", "--api=h:1", "-n", "-5", "-unknown", "--", "-data-dir"}
	if got := SingleDash(root, in); !slices.Equal(got, want) {
		t.Fatalf("SingleDash =\n%q, want\n%q", got, want)
	}
	if in[0] != "-data-dir" {
		t.Error("SingleDash changed its input")
	}
}

func TestFromEnv(t *testing.T) {
	env := map[string]string{"APP_SERVER": "env:1", "APP_TOKEN": "from-env", "APP_COUNT": "x", "APP_EMPTY": ""}
	getenv := func(k string) string { return env[k] }
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	server := cmd.Flags().String("server", "default:1", "")
	token := cmd.Flags().String("token", "", "")
	ca := cmd.Flags().String("ca", "ca-default", "")
	cmd.Flags().Int("count", 0, "")
	if err := cmd.ParseFlags([]string{"--token", "typed"}); err != nil {
		t.Fatal(err)
	}
	set, err := FromEnv(cmd.Flags(), getenv, map[string]string{"server": "APP_SERVER", "token": "APP_TOKEN",
		"ca": "APP_EMPTY", "missing": "APP_SERVER"})
	if err != nil {
		t.Fatal(err)
	}
	if *server != "env:1" || *token != "typed" || *ca != "ca-default" {
		t.Errorf("server %q token %q ca %q: want the variable, the typed flag, the default", *server, *token, *ca)
	}
	if len(set) != 1 || set["server"] != "APP_SERVER" {
		t.Errorf("set = %v, want only server from APP_SERVER", set)
	}
	if cmd.Flags().Changed("server") {
		t.Error("a flag set from the environment reads as typed")
	}
	_, err = FromEnv(cmd.Flags(), getenv, map[string]string{"count": "APP_COUNT"})
	if !IsUsage(err) || !strings.Contains(err.Error(), "$APP_COUNT") || !strings.Contains(err.Error(), "--count") {
		t.Errorf("a variable the flag cannot parse: %v", err)
	}
}

func TestWithoutExample(t *testing.T) {
	run := func(*cobra.Command, []string) {}
	root := &cobra.Command{Use: "prog", Run: run, Example: "  prog --x"}
	shown := &cobra.Command{Use: "shown", Run: run, Example: "  prog shown a"}
	elsewhere := &cobra.Command{Use: "elsewhere", Run: run, Example: "  prog shown b"}
	bare := &cobra.Command{Use: "bare", Run: run}
	hidden := &cobra.Command{Use: "hidden", Run: run, Hidden: true}
	group := &cobra.Command{Use: "group"} // runs nothing
	group.AddCommand(&cobra.Command{Use: "leaf", Run: run})
	root.AddCommand(shown, elsewhere, bare, hidden, group)
	got := WithoutExample(root)
	want := []string{"prog bare", "prog elsewhere", "prog group leaf"}
	if !slices.Equal(got, want) {
		t.Errorf("WithoutExample = %q, want %q", got, want)
	}
}
