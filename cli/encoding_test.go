package cli_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/cli"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// TestTaskCreateUpdateEncoding: --update-encoding reaches the task, shows
// in its description, and an unknown value is a usage error.
func TestTaskCreateUpdateEncoding(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	f.addModel("mnist", safetensors(1))
	base := []string{"task", "create", "--name", "small", "--model", "mnist@1", "--module", moduleSHA}
	if _, err := run(t, addr, append(base, "--update-encoding", "int2")...); !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "int2") {
		t.Fatalf("--update-encoding int2: %v", err)
	}
	for flag, want := range map[string]pb.UpdateEncoding{"none": pb.UpdateEncoding_UPDATE_ENCODING_UNSPECIFIED,
		"int8": pb.UpdateEncoding_UPDATE_ENCODING_INT8, "int4": pb.UpdateEncoding_UPDATE_ENCODING_INT4} {
		out, err := run(t, addr, append(base, "--update-encoding", flag)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.created.GetUpdateEncoding(); got != want {
			t.Fatalf("--update-encoding %s sent %v", flag, got)
		}
		if shown := strings.Contains(out, "UPDATES"); shown != (flag != "none") || (shown && !strings.Contains(out, flag)) {
			t.Errorf("--update-encoding %s: output\n%s", flag, out)
		}
	}
}
