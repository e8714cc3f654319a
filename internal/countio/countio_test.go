package countio_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/fleetlearn/fleetlearn/internal/countio"
)

func TestCounts(t *testing.T) {
	var buf bytes.Buffer
	w := &countio.Writer{W: &buf}
	io.WriteString(w, "hello, ")
	io.WriteString(w, "world")
	if w.N != 12 || buf.String() != "hello, world" {
		t.Errorf("writer: %d bytes, %q", w.N, buf.String())
	}
	r := &countio.Reader{R: iotest.HalfReader(strings.NewReader("0123456789"))}
	b, err := io.ReadAll(r)
	if err != nil || r.N != 10 || string(b) != "0123456789" {
		t.Errorf("reader: %d bytes, %q, %v", r.N, b, err)
	}
	// What a failing writer took is counted, no more.
	fw := &countio.Writer{W: failAfter{3}}
	if n, err := fw.Write([]byte("abcdef")); n != 3 || fw.N != 3 || !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("short write: %d, counted %d, %v", n, fw.N, err)
	}
}

type failAfter struct{ n int }

func (f failAfter) Write(p []byte) (int, error) { return min(len(p), f.n), io.ErrShortWrite }
