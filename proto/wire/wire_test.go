package wire_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

func TestCheckToken(t *testing.T) {
	for _, ok := range []string{"a", "dev-001", "t_1", strings.Repeat("x", 64)} {
		if err := wire.CheckToken("id", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a.b", "a*", "a>", "a b", strings.Repeat("x", 65), "é", "a\x00"} {
		if err := wire.CheckToken("id", bad); !errors.Is(err, wire.ErrToken) {
			t.Errorf("%q: got %v, want ErrToken", bad, err)
		}
	}
}

func TestReportSubjects(t *testing.T) {
	s := wire.ReportSubject("t-1", 42, "dev-9")
	task, round, dev, err := wire.ParseReportSubject(s)
	if err != nil || task != "t-1" || round != 42 || dev != "dev-9" || wire.IsEvalSubject(s) {
		t.Fatalf("%s -> %s %d %s %v", s, task, round, dev, err)
	}
	e := wire.EvalSubject("t-1", 7, "d")
	if _, r, _, err := wire.ParseReportSubject(e); err != nil || r != 7 || !wire.IsEvalSubject(e) {
		t.Fatalf("%s: %d %v", e, r, err)
	}
	for _, bad := range []string{"fl.report.t.1", "fl.report.t.x.d", "fl.other.t.1.d", "x.report.t.1.d", "fl.report.t.1.d.e",
		"fl.report..1.d", "fl.report.t.-1.d", "fl.report.t.99999999999999999999.d"} {
		if _, _, _, err := wire.ParseReportSubject(bad); !errors.Is(err, wire.ErrToken) {
			t.Errorf("%q: got %v", bad, err)
		}
	}
	f := wire.RoundFilters("t", 3)
	if len(f) != 2 || f[0] != "fl.report.t.3.*" || f[1] != "fl.eval.t.3.*" {
		t.Fatalf("filters %v", f)
	}
}

func TestDense(t *testing.T) {
	v := []float32{0, -1.5, math.MaxFloat32, float32(math.Copysign(0, -1))}
	if got, want := wire.AppendDense([]byte("ab"), v), append([]byte("ab"), wire.EncodeDense(v)...); !bytes.Equal(got, want) {
		t.Fatalf("AppendDense = %x, want %x", got, want)
	}
	got, err := wire.DecodeDense(wire.EncodeDense(v), len(v))
	if err != nil {
		t.Fatal(err)
	}
	for i := range v {
		if math.Float32bits(got[i]) != math.Float32bits(v[i]) {
			t.Fatalf("value %d: %v != %v", i, got[i], v[i])
		}
	}
	for name, b := range map[string][]byte{
		"short":  wire.EncodeDense(v)[:15],
		"long":   append(wire.EncodeDense(v), 0, 0, 0, 0),
		"nan":    wire.EncodeDense([]float32{0, float32(math.NaN()), 0, 0}),
		"inf":    wire.EncodeDense([]float32{0, 0, float32(math.Inf(-1)), 0}),
		"ragged": wire.EncodeDense(v)[:13],
	} {
		if _, err := wire.DecodeDense(b, len(v)); !errors.Is(err, wire.ErrPayload) {
			t.Errorf("%s: got %v, want ErrPayload", name, err)
		}
	}
}

func TestSHA256AndSeeds(t *testing.T) {
	if h := wire.SHA256(nil); h != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Fatalf("sha256 of nothing: %s", h)
	}
	if err := wire.CheckSHA256("m", wire.SHA256([]byte("x"))); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "abc", strings.ToUpper(wire.SHA256(nil)), wire.SHA256(nil)[:63] + "g"} {
		if err := wire.CheckSHA256("m", bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if wire.DeviceSeed(1, "a") == wire.DeviceSeed(1, "b") || wire.DeviceSeed(1, "a") != wire.DeviceSeed(1, "a") {
		t.Fatal("device seeds must differ by device and be stable")
	}
}

func FuzzParseReportSubject(f *testing.F) {
	f.Add(wire.ReportSubject("t", 1, "d"))
	f.Add(wire.EvalSubject("task-1", 1<<40, "dev_9"))
	f.Add("fl.report.t.1.d.extra")
	f.Fuzz(func(t *testing.T, s string) {
		checkParsed(t, kindNamed("report"), s)
		checkParsed(t, kindNamed("eval"), s)
	})
}

func FuzzDecodeDense(f *testing.F) {
	f.Add(wire.EncodeDense([]float32{1, 2, 3}), 3)
	f.Add([]byte{0, 0, 0xc0, 0x7f}, 1)
	// A NaN and an Inf past the first group of four, then one in the tail.
	f.Add(wire.EncodeDense([]float32{1, 2, 3, 4, 5, 6, float32(math.NaN()), 8, float32(math.Inf(-1))}), 9)
	f.Add(wire.EncodeDense([]float32{1, 2, 3, 4, 5, 6, 7, 8, float32(math.Inf(1))}), 9)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1<<16 {
			return
		}
		// The reference: each value on its own.
		firstBad := -1
		for i := 0; i+4 <= len(b) && firstBad < 0; i += 4 {
			x := math.Float32frombits(binary.LittleEndian.Uint32(b[i:]))
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				firstBad = i / 4
			}
		}
		v, err := wire.DecodeDense(b, n)
		// The streaming decoder, fed in two pieces, agrees.
		cut := 0
		if len(b) > 0 {
			cut = n % (len(b) + 1)
		}
		d := wire.NewDenseDecoder(n, func([]float32) error { return nil })
		serr := d.Write(b[:cut])
		if serr == nil {
			serr = d.Write(b[cut:])
		}
		if serr == nil {
			serr = d.Close()
		}
		if (err == nil) != (serr == nil) {
			t.Fatalf("whole: %v; in pieces at %d: %v", err, cut, serr)
		}
		if err != nil {
			if !errors.Is(err, wire.ErrPayload) || !errors.Is(serr, wire.ErrPayload) {
				t.Fatalf("errors %v, %v do not wrap ErrPayload", err, serr)
			}
			if len(b) == 4*n && firstBad >= 0 && !strings.Contains(err.Error(), fmt.Sprintf("value %d is", firstBad)) {
				t.Fatalf("error %v does not name value %d, the first non-finite one", err, firstBad)
			}
			if len(b) == 4*n && firstBad < 0 {
				t.Fatalf("refused finite values: %v", err)
			}
			return
		}
		if len(v) != n || string(wire.EncodeDense(v)) != string(b) {
			t.Fatal("accepted payload does not round-trip")
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatal("accepted a non-finite value")
			}
		}
	})
}

func TestSecAggSubjects(t *testing.T) {
	up := wire.SecAggUpSubject("t-1", 7, "dev-1")
	task, round, dev, err := wire.ParseSecAggUpSubject(up)
	if err != nil || task != "t-1" || round != 7 || dev != "dev-1" {
		t.Fatalf("%q parsed to %s/%d/%s, %v", up, task, round, dev, err)
	}
	if down := wire.SecAggDownSubject("t-1", 7, "dev-1"); down != "fl.secagg.down.t-1.7.dev-1" {
		t.Fatalf("down subject %q", down)
	}
	for _, bad := range []string{"fl.secagg.down.t.1.d", "fl.secagg.up.t.1", "fl.secagg.up.t.x.d", "fl.secagg.up.t.1.d.e",
		"fl.report.t.1.d", "fl.secagg.up..1.d"} {
		if _, _, _, err := wire.ParseSecAggUpSubject(bad); !errors.Is(err, wire.ErrToken) {
			t.Errorf("%q: err %v, want ErrToken", bad, err)
		}
	}
}

func TestMaskedSHA256(t *testing.T) {
	a := wire.MaskedSHA256(&pb.MaskedUpdate{Values: []uint32{1, 2, 3}})
	if a != wire.SHA256([]byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0}) {
		t.Fatalf("hash %s is not over little-endian values", a)
	}
	if a == wire.MaskedSHA256(&pb.MaskedUpdate{Values: []uint32{1, 2, 4}}) {
		t.Fatal("different values, same hash")
	}
}

func FuzzParseSecAggUpSubject(f *testing.F) {
	f.Add(wire.SecAggUpSubject("t", 1, "d"))
	f.Add("fl.secagg.up.t.18446744073709551615.d")
	f.Add("fl.secagg.up.t.1.d.extra")
	f.Fuzz(func(t *testing.T, s string) { checkParsed(t, kindNamed("secagg up"), s) })
}

// BenchmarkDecodeDense decodes a 100k-parameter update, as the server does
// for every plaintext report.
func BenchmarkDecodeDense(b *testing.B) {
	v := make([]float32, 100_000)
	for i := range v {
		v[i] = float32(i) * 1e-3
	}
	enc := wire.EncodeDense(v)
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		if _, err := wire.DecodeDense(enc, len(v)); err != nil {
			b.Fatal(err)
		}
	}
}

func TestFailureReason(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	got := wire.FailureReason(long)
	if len(got) > wire.MaxFailureReason || !utf8.ValidString(got) || !strings.HasPrefix(long, got) {
		t.Fatalf("cut to %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	straddle := strings.Repeat("a", wire.MaxFailureReason-1) + "é" // the é crosses the limit
	if got := wire.FailureReason(straddle); got != straddle[:wire.MaxFailureReason-1] {
		t.Fatalf("cut to %q", got)
	}
	if got := wire.FailureReason("bad\x00\nline\xff"); got != "bad\uFFFD\uFFFDline\uFFFD" {
		t.Fatalf("sanitized to %q", got)
	}
}

// BenchmarkDenseDecoder streams a 100k-parameter update through the
// decoder in the pieces a stored message arrives in, as the server's
// intake does twice for every plaintext report.
func BenchmarkDenseDecoder(b *testing.B) {
	v := make([]float32, 100_000)
	for i := range v {
		v[i] = float32(i) * 1e-3
	}
	enc := wire.EncodeDense(v)
	b.SetBytes(int64(len(enc)))
	var sum float32
	for b.Loop() {
		d := wire.NewDenseDecoder(len(v), func(batch []float32) error {
			sum += batch[0]
			return nil
		})
		for p := enc; len(p) > 0; {
			n := min(len(p), 65537) // pieces that split values
			if err := d.Write(p[:n]); err != nil {
				b.Fatal(err)
			}
			p = p[n:]
		}
		if err := d.Close(); err != nil {
			b.Fatal(err)
		}
	}
	_ = sum
}
