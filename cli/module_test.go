package cli_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/cli"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/model/train"
	"github.com/fleetlearn/fleetlearn/wasm"
	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

func TestModuleRegister(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	code := append([]byte("\x00asm\x01\x00\x00\x00"), bytes.Repeat([]byte{0x0b}, 1<<20)...)
	path := writeFile(t, "train.wasm", code)
	sig := writeFile(t, "train.jws", []byte("eyJhbGciOiJFZERTQSIsImtpZCI6InB1YjEifQ..c2ln\n"))
	out, err := run(t, addr, "module", "register", path, "--name", "mnist-mlp", "--signature", sig)
	if err != nil {
		t.Fatal(err)
	}
	if out != digest(code)+"\n" {
		t.Errorf("output = %q, want the sha256", out)
	}
	h := f.moduleHeader
	// No --abi: the header leaves the version to what the module declares.
	if h.GetName() != "mnist-mlp" || h.GetAbiVersion() != 0 || h.GetSha256() != digest(code) ||
		string(h.GetSignature()) != "eyJhbGciOiJFZERTQSIsImtpZCI6InB1YjEifQ..c2ln" || !bytes.Equal(f.moduleData, code) {
		t.Errorf("header = %v, %d bytes", h, len(f.moduleData))
	}

	out, err = run(t, addr, "module", "get", strings.ToUpper(digest(code)))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{digest(code), "mnist-mlp", "publisher-1", "1.0 MiB"} {
		if !strings.Contains(out, s) {
			t.Errorf("module get lacks %q:\n%s", s, out)
		}
	}
	out, err = run(t, addr, "module", "list")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], digest(code)) {
		t.Errorf("module list:\n%s", out)
	}
	out, err = run(t, addr, "module", "list", "-o", "json")
	if err != nil || !strings.Contains(out, `"modules"`) {
		t.Errorf("module list -o json: %v\n%s", err, out)
	}
}

func TestModuleRegisterRefusesBadFiles(t *testing.T) {
	f := newFake()
	addr := f.serve(t)
	if _, err := run(t, addr, "module", "register", writeFile(t, "x.wasm", []byte("#!/bin/sh\n")), "--name", "x"); !errors.Is(err, cli.ErrInput) {
		t.Errorf("not wasm: %v", err)
	}
	wasm := writeFile(t, "x.wasm", []byte("\x00asm\x01\x00\x00\x00"))
	big := writeFile(t, "sig", bytes.Repeat([]byte("a"), 65<<10))
	if _, err := run(t, addr, "module", "register", wasm, "--name", "x", "--signature", big); !errors.Is(err, cli.ErrInput) {
		t.Errorf("huge signature: %v", err)
	}
	if f.moduleHeader != nil {
		t.Error("an upload reached the server")
	}
	_, err := run(t, addr, "module", "get", strings.Repeat("0", 64))
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "not found") {
		t.Errorf("unknown module: %v", err)
	}
}

func TestModuleExample(t *testing.T) {
	out, err := run(t, "", "module", "example")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range embedded.List() {
		if !strings.Contains(out, m.Name) || !strings.Contains(out, m.SHA256) {
			t.Errorf("listing lacks %s (%s):\n%s", m.Name, m.SHA256, out)
		}
	}
	mlp, err := embedded.Lookup("mlp")
	if err != nil {
		t.Fatal(err)
	}

	path := filepath.Join(t.TempDir(), "mlp.wasm")
	out, err = run(t, "", "module", "example", "mlp", "-o", path)
	if err != nil {
		t.Fatal(err)
	}
	if out != mlp.SHA256+"  "+path+"\n" {
		t.Errorf("output %q, want the sha256sum line", out)
	}
	code, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if digest(code) != mlp.SHA256 || len(code) != mlp.Size {
		t.Fatalf("wrote %d bytes with sha256 %s, recorded %d with %s", len(code), digest(code), mlp.Size, mlp.SHA256)
	}

	// An existing file is kept unless --force.
	if err := os.WriteFile(path, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "", "module", "example", "mlp", "-o", path); !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("overwrite without --force: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "mine" {
		t.Fatal("the existing file was replaced")
	}
	if _, err := run(t, "", "module", "example", "mlp", "-o", path, "--force"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); digest(b) != mlp.SHA256 {
		t.Fatal("--force did not replace the file")
	}

	out, err = run(t, "", "module", "example", "softmax", "-o", "-")
	if sm, _ := embedded.Lookup("softmax"); err != nil || digest([]byte(out)) != sm.SHA256 {
		t.Errorf("-o -: %v, %d bytes", err, len(out))
	}
	if _, err := runWith(t, []cli.Option{cli.WithTerminal(true)}, "", "module", "example", "mlp", "-o", "-"); !errors.Is(err, cli.ErrUsage) {
		t.Errorf("binary to a terminal: %v", err)
	}
	_, err = run(t, "", "module", "example", "resnet", "-o", filepath.Join(t.TempDir(), "x.wasm"))
	if !errors.Is(err, cli.ErrUsage) || !errors.Is(err, embedded.ErrUnknown) || !strings.Contains(err.Error(), "mlp") {
		t.Errorf("unknown module: %v", err)
	}

	if testing.Short() {
		return // compiling the module takes long under the race detector
	}
	// What was written is a module the agents' sandbox accepts: it loads
	// under its digest and passes the ABI version handshake of a call.
	ctx := context.Background()
	sb, err := wasm.New()
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(ctx)
	mod, err := sb.Load(ctx, code, mlp.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close(ctx)
	init, err := train.InitMLP([]int{2, 3, 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	d := &data.Dataset{Features: []float32{0, 1, 1, 0}, Labels: []uint8{1, 0}, Dim: 2, NumClasses: 2}
	if _, err := mod.Evaluate(ctx, wasm.Call{Model: init, Data: d}); err != nil {
		t.Fatalf("evaluate: %v", err)
	}
}

func TestModuleExampleHelp(t *testing.T) {
	out, err := run(t, "", "module", "example", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range embedded.List() {
		if !strings.Contains(out, "  "+m.Name+" ") {
			t.Errorf("help does not list %s:\n%s", m.Name, out)
		}
	}
	if strings.Contains(out, "--server") || strings.Contains(out, "--token-file") {
		t.Errorf("help lists global flags that do not apply:\n%s", out)
	}
}
