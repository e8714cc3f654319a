package wire_test

import (
	"errors"
	"testing"

	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// A device publishes on subjects that name it; the server parses them and
// trusts the device they name only because NATS lets no other device
// publish there. Each parser must therefore accept exactly the subjects its
// builder makes, one spelling each, and none of another namespace.

// subjectKind is a subject namespace a device publishes in.
type subjectKind struct {
	name  string
	build func(task string, round uint64, device string) string
	parse func(subj string) (task string, round uint64, device string, err error)
	// deviceOnly: the subject names the device alone.
	deviceOnly bool
}

var subjectKinds = []subjectKind{
	{name: "report", build: wire.ReportSubject, parse: parseReport("fl.report.")},
	{name: "eval", build: wire.EvalSubject, parse: parseReport("fl.eval.")},
	{name: "chunk", build: wire.ChunkSubject, parse: wire.ParseChunkSubject},
	{name: "failure", build: wire.FailureSubject, parse: wire.ParseFailureSubject},
	{name: "secagg up", build: wire.SecAggUpSubject, parse: wire.ParseSecAggUpSubject},
	{name: "check-in", deviceOnly: true,
		build: func(_ string, _ uint64, device string) string { return wire.CheckInSubject(device) },
		parse: func(subj string) (string, uint64, string, error) {
			device, err := wire.ParseCheckInSubject(subj)
			return "", 0, device, err
		}},
}

// parseReport is ParseReportSubject restricted to one of its two
// namespaces, so that update and evaluation subjects count as two kinds.
func parseReport(prefix string) func(string) (string, uint64, string, error) {
	return func(subj string) (string, uint64, string, error) {
		task, round, device, err := wire.ParseReportSubject(subj)
		if err == nil && (len(subj) < len(prefix) || subj[:len(prefix)] != prefix) {
			return "", 0, "", wire.ErrToken
		}
		return task, round, device, err
	}
}

func kindNamed(name string) subjectKind {
	for _, k := range subjectKinds {
		if k.name == name {
			return k
		}
	}
	panic("no subject kind " + name)
}

// checkParsed: a subject kind's parser accepts subj only if it re-builds
// to itself, names valid identifiers and is in no other namespace.
func checkParsed(t *testing.T, kind subjectKind, subj string) {
	t.Helper()
	task, round, device, err := kind.parse(subj)
	if err != nil {
		if !errors.Is(err, wire.ErrToken) {
			t.Fatalf("%s %q: error %v does not wrap ErrToken", kind.name, subj, err)
		}
		return
	}
	if again := kind.build(task, round, device); again != subj {
		t.Fatalf("%s %q parsed to %q/%d/%q, which builds %q", kind.name, subj, task, round, device, again)
	}
	if err := wire.CheckToken("device", device); err != nil {
		t.Fatalf("%s %q: accepted device %q: %v", kind.name, subj, device, err)
	}
	if err := wire.CheckToken("task", task); err != nil && !kind.deviceOnly {
		t.Fatalf("%s %q: accepted task %q: %v", kind.name, subj, task, err)
	}
	for _, other := range subjectKinds {
		if _, _, _, err := other.parse(subj); other.name != kind.name && err == nil {
			t.Fatalf("%s %q also parses as a %s subject", kind.name, subj, other.name)
		}
	}
}

// checkBuilt: valid identifiers come back from the subject they build.
func checkBuilt(t *testing.T, kind subjectKind, task string, round uint64, device string) {
	t.Helper()
	if wire.CheckToken("task", task) != nil || wire.CheckToken("device", device) != nil {
		return
	}
	subj := kind.build(task, round, device)
	gotTask, gotRound, gotDevice, err := kind.parse(subj)
	if kind.deviceOnly {
		task, round = "", 0
	}
	if err != nil || gotTask != task || gotRound != round || gotDevice != device {
		t.Fatalf("%s %q built of %q/%d/%q parses to %q/%d/%q, %v", kind.name, subj, task, round, device, gotTask, gotRound, gotDevice, err)
	}
}

// fuzzSubject checks kind's parser on an arbitrary subject and on the
// subject its builder makes of arbitrary identifiers.
func fuzzSubject(f *testing.F, kind subjectKind) {
	f.Fuzz(func(t *testing.T, subj, task string, round uint64, device string) {
		checkParsed(t, kind, subj)
		checkBuilt(t, kind, task, round, device)
	})
}

func FuzzParseCheckInSubject(f *testing.F) { fuzzSubject(f, kindNamed("check-in")) }
func FuzzParseFailureSubject(f *testing.F) { fuzzSubject(f, kindNamed("failure")) }
func FuzzParseChunkSubject(f *testing.F)   { fuzzSubject(f, kindNamed("chunk")) }
