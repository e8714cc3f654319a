package cli_test

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/cli"
)

// TestEveryCommandHasExamples: each command that runs shows in its help
// how it is run: an Example with at least one line that runs it. Each
// example line that runs fleetlearn names a command that exists with flags
// it takes.
func TestEveryCommandHasExamples(t *testing.T) {
	root := cli.NewRootCommand(cli.WithGetenv(func(string) string { return "" }))
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.Runnable() || c.Hidden || c.Name() == "help" || c == root {
			return
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s has no Example", c.CommandPath())
			return
		}
		runsIt := false
		for _, args := range exampleRuns(c.Example) {
			// A fresh tree for each line: parsing sets the flags.
			fresh := cli.NewRootCommand(cli.WithGetenv(func(string) string { return "" }))
			fresh.InitDefaultHelpFlag()
			fresh.InitDefaultVersionFlag() // as Execute does
			cmd, rest, err := fresh.Find(args)
			if err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), strings.Join(args, " "), err)
				continue
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), strings.Join(args, " "), err)
			}
			runsIt = runsIt || cmd.CommandPath() == c.CommandPath()
		}
		if !runsIt {
			t.Errorf("%s: no line of its Example runs it:\n%s", c.CommandPath(), c.Example)
		}
	}
	walk(root)
}

// exampleRuns splits an Example into the arguments of each line that runs
// fleetlearn, as a shell would (quotes, a trailing backslash continues the
// line), up to a redirection, pipe or comment.
func exampleRuns(example string) [][]string {
	var runs [][]string
	text := strings.ReplaceAll(example, "\\\n", " ")
	for line := range strings.SplitSeq(text, "\n") {
		words := shellWords(strings.TrimSpace(line))
		if len(words) == 0 || words[0] != "fleetlearn" {
			continue
		}
		runs = append(runs, words[1:])
	}
	return runs
}

// shellWords splits line into words, keeping quoted text whole, and stops
// at the first unquoted #, |, >, < or ;.
func shellWords(line string) []string {
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case strings.ContainsRune("#|><;", r):
			if inWord {
				words = append(words, w.String())
			}
			return words
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}
