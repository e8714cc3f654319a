package cli_test

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/server"
	"github.com/fleetlearn/fleetlearn/server/servertest"
)

// TestFlagsOverrideEnvironment: a flag on the command line beats its
// environment variable, and also the variable of a flag it cannot be used
// with (--token beats $FLEETLEARN_TOKEN_FILE, --insecure beats
// $FLEETLEARN_CA); two variables that contradict each other are refused
// by name; the usage never shows a variable's value.
func TestFlagsOverrideEnvironment(t *testing.T) {
	h := servertest.New(t)
	tokenBytes, err := os.ReadFile(server.AdminTokenPath(h.Dir))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tokenBytes))
	missing := filepath.Join(t.TempDir(), "missing")
	notPEM := writeFile(t, "ca.crt", []byte("not a certificate"))
	withEnv := func(env map[string]string) []cli.Option {
		return []cli.Option{cli.WithTerminal(false), cli.WithGetenv(func(k string) string { return env[k] })}
	}
	good := map[string]string{cli.ServerEnv: h.GRPCAddr(), cli.CAEnv: server.CAFile(h.Dir),
		cli.TokenFileEnv: server.AdminTokenPath(h.Dir)}
	// with is good with the variables named in kv (name, value, …) set,
	// or unset where the value is empty.
	with := func(kv ...string) map[string]string {
		env := maps.Clone(good)
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(env, kv[i])
			} else {
				env[kv[i]] = kv[i+1]
			}
		}
		return env
	}
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"--token over $FLEETLEARN_TOKEN_FILE", with(cli.TokenFileEnv, missing), []string{"--token", token}},
		{"--token over $FLEETLEARN_TOKEN", with(cli.TokenEnv, "not-a-token"), []string{"--token", token}},
		{"--token-file over $FLEETLEARN_TOKEN", with(cli.TokenFileEnv, "", cli.TokenEnv, "not-a-token"),
			[]string{"--token-file", server.AdminTokenPath(h.Dir)}},
		{"--token-file over $FLEETLEARN_TOKEN_FILE", with(cli.TokenFileEnv, missing),
			[]string{"--token-file", server.AdminTokenPath(h.Dir)}},
		{"--server over $FLEETLEARN_SERVER", with(cli.ServerEnv, freePort(t)), []string{"--server", h.GRPCAddr()}},
		{"--ca over $FLEETLEARN_CA", with(cli.CAEnv, notPEM), []string{"--ca", server.CAFile(h.Dir)}},
	} {
		if _, err := runWith(t, withEnv(c.env), "", append(c.args, "task", "list")...); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}

	// --insecure against a plaintext server, with a CA in the environment.
	plain := newFake().serve(t)
	if _, err := runWith(t, withEnv(map[string]string{cli.CAEnv: server.CAFile(h.Dir)}), "",
		"--server", plain, "--insecure", "task", "list"); err != nil {
		t.Errorf("--insecure over $FLEETLEARN_CA: %v", err)
	}

	_, err = runWith(t, withEnv(with(cli.TokenEnv, token)), "", "task", "list")
	if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "$FLEETLEARN_TOKEN and $FLEETLEARN_TOKEN_FILE") {
		t.Errorf("both variables: %v", err)
	}
	_, err = runWith(t, withEnv(with(cli.TokenFileEnv, missing)), "", "task", "list")
	if !errors.Is(err, cli.ErrInput) || !strings.Contains(err.Error(), "$FLEETLEARN_TOKEN_FILE") {
		t.Errorf("a missing token file named by the environment: %v", err)
	}
	out, err := runWith(t, withEnv(with(cli.TokenEnv, "secret-token-value")), "", "task", "list", "--help")
	if err != nil || strings.Contains(out, "secret-token-value") || !strings.Contains(out, "--token") {
		t.Errorf("usage with $FLEETLEARN_TOKEN set: %v\n%s", err, out)
	}
}
