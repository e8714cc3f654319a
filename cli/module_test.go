package cli_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/cli"
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
	if h.GetName() != "mnist-mlp" || h.GetAbiVersion() != 1 || h.GetSha256() != digest(code) ||
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
