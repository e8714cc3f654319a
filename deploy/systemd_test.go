package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// systemdUnit is one of deploy/systemd's units and what it starts.
type systemdUnit struct {
	file    string // the unit's file name in systemd/
	binary  string // the release binary ExecStart runs from /usr/local/bin
	argsVar string // the environment variable of extra flags
	// maxExposure is the highest "Overall exposure level" systemd-analyze
	// security may give the unit: its rating once hardened.
	maxExposure float64
	// accepts are checks this unit alone may fail (beyond
	// acceptedExposures), and why.
	accepts map[string]string
	// dropInExposure, where not 0, says the unit's comments show a drop-in
	// (a "#   [Service]" line and the "#   Key=value" lines after it) that
	// is verified and rated too, with the unit: at most this exposure,
	// failing no check but those accepted and dropInAccepts.
	dropInExposure float64
	dropInAccepts  map[string]string
	// replica marks a unit of a replicated aggregator: its database comes
	// from a required environment file, shown in its comments, with the
	// password in $PGPASSWORD, and it is always restarted.
	replica bool
}

var systemdUnits = []systemdUnit{
	{file: "fleetlearn-server.service", binary: "fleetlearn-server", argsVar: "FLEETLEARN_SERVER_ARGS", maxExposure: 1.1},
	{file: "fleetlearn-server-replica.service", binary: "fleetlearn-server", argsVar: "FLEETLEARN_SERVER_ARGS", maxExposure: 1.1, replica: true},
	{file: "fleetlearn-edge.service", binary: "fleetlearn-edge", argsVar: "FLEETLEARN_EDGE_ARGS", maxExposure: 1.1},
	{
		file: "fleetlearn-worker.service", binary: "fleetlearn-worker", argsVar: "FLEETLEARN_WORKER_ARGS", maxExposure: 1.4,
		accepts: map[string]string{
			"Delegate":                           "the agent meters each rank in a child cgroup of its own",
			"ProtectControlGroups":               "the delegated subtree must be writable; the rest of /sys/fs/cgroup is root's",
			"ProcSubset":                         "/proc/meminfo (the memory to offer), /proc/driver/nvidia, training libraries",
			"RestrictAddressFamilies_AF_NETLINK": "NCCL and Gloo list interfaces with getifaddrs(), over netlink",
			"SystemCallFilter_resources":         "OpenMP, PyTorch and NCCL set CPU affinity and NUMA memory policy",
		},
		// The GPU drop-in.
		dropInExposure: 1.6,
		dropInAccepts: map[string]string{
			"PrivateDevices": "a private /dev has no /dev/nvidia* nodes; DevicePolicy=closed and DeviceAllow= limit access instead",
		},
	},
}

// acceptedExposures are the systemd-analyze security checks (their JSON
// names) the units are allowed to fail, and why. Any other failing check is
// a hardening directive lost, or a new check to satisfy or to add here.
var acceptedExposures = map[string]string{
	"PrivateNetwork":                        "the API, NATS and the agents' connections are the services' purpose",
	"IPAddressDeny":                         "devices connect from, and aggregators live at, any address",
	"RestrictAddressFamilies_AF_INET_INET6": "the same network",
	"RestrictAddressFamilies_AF_UNIX":       "glibc's NSS modules (systemd-resolved, nscd) in cgo builds",
	"MemoryDenyWriteExecute":                "wazero compiles WASM modules to native code; CUDA and PyTorch compile kernels",
	"RootDirectoryOrRootImage":              "the binaries run from the host's /usr/local/bin",
	"DeviceAllow":                           "ProtectClock= leaves read access to the RTC",
}

// systemdVersion returns the major version systemd-analyze reports, as in
// "systemd 252 (252.38-1~deb12u1)".
func systemdVersion(t *testing.T, analyze string) int {
	t.Helper()
	out, err := exec.Command(analyze, "--version").Output()
	if err != nil {
		t.Fatalf("systemd-analyze --version: %v", err)
	}
	m := regexp.MustCompile(`^systemd (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze --version: no version in %q", out)
	}
	v, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatalf("systemd-analyze --version: %v", err)
	}
	return v
}

// TestSystemdUnits checks deploy/systemd's units with systemd's own tools and
// the binaries they start: systemd-analyze verify accepts them (with
// ExecStart pointing at freshly built binaries, since verify checks the
// executable), the binary accepts ExecStart's flags and those of the
// environment-file examples in the unit's comments, and systemd-analyze
// security rates the hardening no worse than it is now.
func TestSystemdUnits(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not on PATH (Debian and Ubuntu package systemd): the systemd units are not checked")
	}
	version := systemdVersion(t, analyze)
	bin := bins(t)
	dir := t.TempDir()

	var copies []string
	for _, u := range systemdUnits {
		src, err := os.ReadFile(filepath.Join("systemd", u.file))
		if err != nil {
			t.Fatal(err)
		}
		installed := "ExecStart=/usr/local/bin/" + u.binary + " "
		if n := bytes.Count(src, []byte(installed)); n != 1 {
			t.Fatalf("%s: %d lines start with %q, want 1", u.file, n, installed)
		}
		built := "ExecStart=" + filepath.Join(bin, u.binary) + " "
		cp := filepath.Join(dir, u.file)
		if err := os.WriteFile(cp, bytes.Replace(src, []byte(installed), []byte(built), 1), 0o644); err != nil {
			t.Fatal(err)
		}
		copies = append(copies, cp)

		t.Run(u.file+"/flags", func(t *testing.T) { checkUnitFlags(t, u, string(src), bin) })
		if u.replica {
			t.Run(u.file+"/replica", func(t *testing.T) { checkReplicaUnit(t, u, string(src), bin) })
		}
		t.Run(u.file+"/security", func(t *testing.T) {
			checkUnitSecurity(t, analyze, version, u.file, cp, u.maxExposure, u.accepts)
		})
		if u.dropInExposure == 0 {
			continue
		}
		dropIn, err := commentedDropIn(string(src))
		if err != nil {
			t.Fatalf("%s: %v", u.file, err)
		}
		// Appended, the section applies as a drop-in would: later values
		// replace single ones, and list settings (DeviceAllow=) add up.
		withDropIn := filepath.Join(dir, "drop-in", u.file)
		if err := os.MkdirAll(filepath.Dir(withDropIn), 0o755); err != nil {
			t.Fatal(err)
		}
		unit, err := os.ReadFile(cp)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(withDropIn, append(unit, dropIn...), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Run(u.file+"/drop-in-verify", func(t *testing.T) {
			out, err := verifyUnits(analyze, version, withDropIn)
			if err != nil {
				t.Errorf("%v\n%s", err, out)
			}
			if m := mentions(out, u.file); m != "" {
				t.Errorf("systemd-analyze verify complains about %s with its drop-in:\n%s", u.file, m)
			}
		})
		t.Run(u.file+"/drop-in-security", func(t *testing.T) {
			accepts := maps.Clone(u.accepts)
			maps.Copy(accepts, u.dropInAccepts)
			checkUnitSecurity(t, analyze, version, u.file, withDropIn, u.dropInExposure, accepts)
		})
	}

	t.Run("verify", func(t *testing.T) {
		out, err := verifyUnits(analyze, version, copies...)
		if err != nil {
			t.Errorf("%v\n%s", err, out)
		}
		for _, u := range systemdUnits {
			if m := mentions(out, u.file); m != "" {
				t.Errorf("systemd-analyze verify complains about %s:\n%s", u.file, m)
			}
		}
		if !t.Failed() && out != "" {
			t.Logf("systemd-analyze verify, about other units:\n%s", out)
		}
	})

	// verify must be able to fail here: on a container without systemd as
	// PID 1 it might load nothing and report nothing.
	t.Run("verify-catches-errors", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "fleetlearn-broken.service")
		unit := "[Service]\nExecStart=" + filepath.Join(bin, "no-such-binary") + "\nProtectSystem=sometimes\n"
		if err := os.WriteFile(bad, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := verifyUnits(analyze, version, bad)
		got := mentions(out, "fleetlearn-broken.service")
		if err == nil || !strings.Contains(got, "no-such-binary") || !strings.Contains(got, "sometimes") {
			t.Errorf("systemd-analyze verify of a broken unit: err %v, want an error naming the missing binary and the bad ProtectSystem= value:\n%s", err, out)
		}
	})
}

// verifyUnits runs systemd-analyze verify on the unit files. --man=no: the
// Documentation= URL is not a man page to look up; --recursive-errors=no
// (systemd 250 and later): only the named units' own errors fail it, not
// those of network-online.target and the like on the host.
func verifyUnits(analyze string, version int, files ...string) (string, error) {
	args := []string{"verify", "--man=no"}
	if version >= 250 {
		args = append(args, "--recursive-errors=no")
	}
	cmd := exec.Command(analyze, append(args, files...)...)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0", "SYSTEMD_PAGER=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("systemd-analyze verify: %w", err)
	}
	return string(out), err
}

// mentions returns the lines of out that name the unit: systemd-analyze
// starts each with the unit's name or file.
func mentions(out, unit string) string {
	var b strings.Builder
	for line := range strings.Lines(out) {
		if strings.Contains(line, unit) {
			b.WriteString(line)
		}
	}
	return b.String()
}

// checkUnitFlags runs the unit's binary with ExecStart's flags, and with
// each example of the environment file in its comments, followed by --help:
// pflag parses in order, so an unknown flag or a bad value makes it fail
// before it gets to --help.
func checkUnitFlags(t *testing.T, u systemdUnit, unit, bin string) {
	argv, err := execStart(unit)
	if err != nil {
		t.Fatalf("%s: %v", u.file, err)
	}
	if want := "/usr/local/bin/" + u.binary; argv[0] != want {
		t.Fatalf("%s: ExecStart runs %s, want %s", u.file, argv[0], want)
	}
	examples := [][]string{nil} // the environment file absent
	if u.replica {
		examples = nil // required: the unit does not start without it
	}
	env := unitEnvExample(unit)
	re := regexp.MustCompile(`(?m)^#\s+` + u.argsVar + `="([^"]*)"$`)
	for _, m := range re.FindAllStringSubmatch(unit, -1) {
		examples = append(examples, strings.Fields(m[1]))
	}
	if len(examples) == 0 || examples[len(examples)-1] == nil {
		t.Errorf("%s: no example %s=\"…\" line in the comments", u.file, u.argsVar)
	}
	for _, extra := range examples {
		args, err := expandExecStart(argv[1:], u.file, u.argsVar, extra, env)
		if err != nil {
			t.Fatalf("%s: %v", u.file, err)
		}
		cmd := exec.Command(filepath.Join(bin, u.binary), append(args, "--help")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s %s --help: %v\n%s", u.binary, strings.Join(args, " "), err, out)
		}
	}
}

// unitEnvExample is the environment file the unit's comments show: the
// lines "#   NAME=value" with an upper-case NAME and an unquoted value.
func unitEnvExample(unit string) map[string]string {
	env := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^#\s+([A-Z][A-Z0-9_]*)=([^"\s]\S*)$`).FindAllStringSubmatch(unit, -1) {
		env[m[1]] = m[2]
	}
	return env
}

// checkReplicaUnit checks a replica's unit: the database and the NATS
// cluster come from a required environment file whose example in the
// comments keeps the password out of the URL, in $PGPASSWORD; the replica
// names itself by the host; it is always restarted (a replica that lost
// the lease exits to come back as a standby) except after a command line
// that cannot work, which an empty store variable is.
func checkReplicaUnit(t *testing.T, u systemdUnit, unit, bin string) {
	argv, err := execStart(unit)
	if err != nil {
		t.Fatalf("%s: %v", u.file, err)
	}
	env := unitEnvExample(unit)
	values := map[string]string{}
	for _, w := range argv[1:] {
		if name, v, ok := strings.Cut(strings.TrimPrefix(w, "--"), "="); ok {
			values[name] = v
		}
	}
	for _, flag := range []string{"store", "nats-url"} {
		ref := regexp.MustCompile(`^\$\{([A-Z][A-Z0-9_]*)\}$`).FindStringSubmatch(values[flag])
		if ref == nil {
			t.Errorf("%s: --%s=%q: want it from the environment file, as ${NAME}", u.file, flag, values[flag])
		} else if env[ref[1]] == "" {
			t.Errorf("%s: --%s=${%s}: the environment file in the comments does not set it", u.file, flag, ref[1])
		}
	}
	if values["replica-name"] != "%H" {
		t.Errorf("%s: --replica-name=%q: want %%H, the host's name, unique to each replica", u.file, values["replica-name"])
	}
	store := env["FLEETLEARN_STORE"]
	if pu, err := url.Parse(store); err != nil || pu.Scheme != "postgres" || pu.User == nil {
		t.Errorf("%s: the example FLEETLEARN_STORE=%s is not a postgres:// URL with a user (%v)", u.file, store, err)
	} else if _, set := pu.User.Password(); set {
		t.Errorf("%s: the example FLEETLEARN_STORE holds the password: give it in PGPASSWORD", u.file)
	}
	if env["PGPASSWORD"] == "" {
		t.Errorf("%s: the example environment file sets no PGPASSWORD", u.file)
	}
	for key, want := range map[string]string{
		"EnvironmentFile":          "/etc/fleetlearn/replica.env",
		"Restart":                  "always",
		"RestartPreventExitStatus": "2",
	} {
		if got := unitSetting(unit, key); got != want {
			t.Errorf("%s: %s=%q, want %q", u.file, key, got, want)
		}
	}
	// The store variable missing from the file: a usage error (status 2),
	// which the unit does not restart, instead of a server on SQLite.
	empty := maps.Clone(env)
	empty["FLEETLEARN_STORE"] = ""
	args, err := expandExecStart(argv[1:], u.file, u.argsVar, nil, empty)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, u.binary), args...)
	cmd.Env = []string{"HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "--store") {
		t.Errorf("%s with FLEETLEARN_STORE empty: %v, want exit status 2 naming --store\n%s", u.binary, err, out)
	}
}

// unitSetting is the value of the unit's one Key= line.
func unitSetting(unit, key string) string {
	v := ""
	for line := range strings.Lines(unit) {
		if rest, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), key+"="); ok {
			v = rest
		}
	}
	return v
}

// execStart returns the words of the unit's ExecStart=, its continued lines
// joined. Quotes and specifiers other than %S are beyond this parser and
// fail.
func execStart(unit string) ([]string, error) {
	var cmdline string
	found := 0
	lines := strings.Split(unit, "\n")
	for i := 0; i < len(lines); i++ {
		v, ok := strings.CutPrefix(lines[i], "ExecStart=")
		if !ok {
			continue
		}
		for strings.HasSuffix(v, `\`) && i+1 < len(lines) {
			i++
			v = strings.TrimSuffix(v, `\`) + " " + lines[i]
		}
		cmdline = v
		found++
	}
	if found != 1 {
		return nil, fmt.Errorf("%d ExecStart= lines, want 1", found)
	}
	if strings.ContainsAny(cmdline, `"'`) {
		return nil, errors.New("ExecStart= has quotes: extend execStart to split it as systemd does")
	}
	argv := strings.Fields(cmdline)
	if len(argv) == 0 || !strings.HasPrefix(argv[0], "/") {
		return nil, fmt.Errorf("ExecStart=%s: want an absolute path without prefixes", cmdline)
	}
	return argv, nil
}

// commentedDropIn returns the drop-in that the unit's comments show, as a
// section to append: the "#   [Service]" line and the indented "#   Key=value"
// lines that follow it.
func commentedDropIn(unit string) (string, error) {
	var b strings.Builder
	in := false
	for line := range strings.Lines(unit) {
		text, indented := strings.CutPrefix(strings.TrimRight(line, "\n"), "#   ")
		switch {
		case !in && indented && text == "[Service]":
			if b.Len() > 0 {
				return "", errors.New("two commented drop-ins")
			}
			in = true
			b.WriteString("\n" + text + "\n")
		case in && indented && regexp.MustCompile(`^[A-Z][A-Za-z]+=\S`).MatchString(text):
			b.WriteString(text + "\n")
		default:
			in = false
		}
	}
	if !strings.Contains(b.String(), "=") {
		return "", errors.New("no commented drop-in: a \"#   [Service]\" line and \"#   Key=value\" lines after it")
	}
	return b.String(), nil
}

// expandExecStart expands ExecStart's words as systemd would for unit: %S
// is /var/lib for a system unit, %d its credentials directory, %H a host
// name, ${NAME} within a word the value env gives it, and the word
// $argsVar becomes the words of extra.
func expandExecStart(words []string, unit, argsVar string, extra []string, env map[string]string) ([]string, error) {
	var args []string
	for _, w := range words {
		if w == "$"+argsVar {
			args = append(args, extra...)
			continue
		}
		w = strings.ReplaceAll(w, "%S", "/var/lib")
		w = strings.ReplaceAll(w, "%d", "/run/credentials/"+unit)
		w = strings.ReplaceAll(w, "%H", "aggregator-1")
		w = regexp.MustCompile(`\$\{([A-Z][A-Z0-9_]*)\}`).ReplaceAllStringFunc(w, func(ref string) string {
			if v, ok := env[ref[2:len(ref)-1]]; ok {
				return v
			}
			return ref
		})
		if strings.ContainsAny(w, "%$") {
			return nil, fmt.Errorf("ExecStart word %q: a specifier or variable the test does not expand", w)
		}
		args = append(args, w)
	}
	return args, nil
}

// securityCheck is one entry of systemd-analyze security --json.
type securityCheck struct {
	Set         bool    `json:"set"`
	Name        string  `json:"name"`
	JSONField   string  `json:"json_field"`
	Description string  `json:"description"`
	Exposure    *string `json:"exposure"`
}

// checkUnitSecurity rates the unit file with systemd-analyze security
// --offline (systemd 252 and later): the overall exposure must not exceed
// maxExposure, and only the checks of acceptedExposures and accepts may
// fail. name is the unit's own file name.
func checkUnitSecurity(t *testing.T, analyze string, version int, name, file string, maxExposure float64, accepts map[string]string) {
	if version < 252 {
		t.Skipf("systemd-analyze %d cannot rate a unit file (security --offline needs systemd 252)", version)
	}
	out, err := exec.Command(analyze, "security", "--offline=yes", "--no-pager", file).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security %s: %v\n%s", name, err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for ` + regexp.QuoteMeta(name) + `: (\d+(?:\.\d+)?)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security %s printed no overall exposure level:\n%s", name, out)
	}
	score, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	if score > maxExposure {
		t.Errorf("%s: exposure %.1f, want at most %.1f: hardening was lost\n%s", name, score, maxExposure, out)
	}

	js, err := exec.Command(analyze, "security", "--offline=yes", "--no-pager", "--json=short", file).Output()
	if err != nil {
		t.Fatalf("systemd-analyze security --json %s: %v", name, err)
	}
	var checks []securityCheck
	if err := json.Unmarshal(js, &checks); err != nil {
		t.Fatalf("systemd-analyze security --json %s: %v", name, err)
	}
	if len(checks) == 0 {
		t.Fatalf("systemd-analyze security --json %s: no checks", name)
	}
	for _, c := range checks {
		if c.Set || c.Exposure == nil {
			continue
		}
		_, ok := acceptedExposures[c.JSONField]
		if _, mine := accepts[c.JSONField]; !ok && !mine {
			t.Errorf("%s fails %s (%s, exposure %s): restore the directive, or accept it in acceptedExposures with the reason",
				name, c.Name, c.Description, *c.Exposure)
		}
	}
	if t.Failed() {
		t.Logf("systemd-analyze security %s:\n%s", name, out)
	}
}
