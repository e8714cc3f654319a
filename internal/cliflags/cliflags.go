// Package cliflags holds what the binaries' command lines share. It keeps
// the Go flag package's spelling working for commands that moved to cobra:
// "-data-dir x" and "-data-dir=x" were long flags there, while pflag reads
// "-data-dir" as the shorthands d, a, t, …, so scripts and unit files
// written for the old binaries keep working. And it gives flags their
// environment variables, which a flag on the command line overrides.
package cliflags

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// SingleDash rewrites each "-name" or "-name=value" in args to "--name…"
// where name (two characters or more) is a long flag of root or of any
// command below it. Everything after "--" is left alone, as are negative
// numbers and unknown names.
func SingleDash(root *cobra.Command, args []string) []string {
	long := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		add := func(f *pflag.Flag) { long[f.Name] = true }
		c.Flags().VisitAll(add)
		c.PersistentFlags().VisitAll(add)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	out := make([]string, len(args))
	copy(out, args)
	for i, a := range out {
		if a == "--" {
			break
		}
		if len(a) < 3 || a[0] != '-' || a[1] == '-' {
			continue
		}
		name, _, _ := strings.Cut(a[1:], "=")
		if len(name) >= 2 && long[name] {
			out[i] = "-" + a
		}
	}
	return out
}

// usageError is a command line that cannot work as given.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// Usage makes an error that is the command line's fault, which the
// binaries exit with status 2 for, as the flag package did.
func Usage(format string, a ...any) error { return &usageError{fmt.Errorf(format, a...)} }

// IsUsage reports whether err is the command line's fault.
func IsUsage(err error) bool {
	var u *usageError
	return errors.As(err, &u)
}

// FromEnv sets each flag of fs named in env (flag name → environment
// variable) that the command line left alone to its variable's value, when
// that is not empty, and returns the flags it set with their variables.
// The command line always wins over the environment. A flag set here keeps
// Changed false, so that a caller can still tell a flag the user typed from
// a variable left in the environment, and the variable's value is never
// shown as a default in the usage (it may be a secret).
func FromEnv(fs *pflag.FlagSet, getenv func(string) string, env map[string]string) (map[string]string, error) {
	set := map[string]string{}
	for name, variable := range env {
		f := fs.Lookup(name)
		if f == nil || f.Changed {
			continue
		}
		v := getenv(variable)
		if v == "" {
			continue
		}
		if err := f.Value.Set(v); err != nil {
			return nil, Usage("$%s: %v (it stands for --%s; unset it or pass --%s)", variable, err, name, name)
		}
		set[name] = variable
	}
	return set, nil
}

// WithoutExample lists the commands under root, root included, that run
// but whose Example does not show how: no line of it names the command's
// path. Help and hidden commands are left out.
func WithoutExample(root *cobra.Command) []string {
	var missing []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.Runnable() || c.Hidden || c.Name() == "help" {
			return
		}
		if !strings.Contains(c.Example, c.CommandPath()) {
			missing = append(missing, c.CommandPath())
		}
	}
	walk(root)
	return missing
}
