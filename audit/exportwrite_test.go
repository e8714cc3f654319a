package audit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
)

// An export assembled from the log's parts is byte for byte the export the
// log writes itself with only its latest checkpoint.
func TestExportWriterMatchesExport(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, _ := openTest(t)
		appendN(t, lg, 37)
		want := exportBytes(t, lg, WithLatestCheckpointOnly())

		cp, err := lg.Latest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		x, err := NewExportWriter(&got, lg.PublicKeys(), [][]byte{cp.Note}, cp.Size)
		if err != nil {
			t.Fatal(err)
		}
		for e, err := range lg.Entries(ctx, 0, cp.Size) {
			if err != nil {
				t.Fatal(err)
			}
			h := e.LeafHash()
			if err := x.WriteEntry(e, h[:]); err != nil {
				t.Fatal(err)
			}
		}
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("assembled export differs:\n%s\nwant\n%s", got.Bytes(), want)
		}
		rep, err := VerifyExport(bytes.NewReader(got.Bytes()), WithEntryKey(lg.PublicKeys().Entry),
			WithVerifierKey(lg.PublicKeys().VerifierKey))
		if err != nil || rep.Entries != 37 || rep.Checkpoints != 1 {
			t.Fatalf("verify: %+v, %v", rep, err)
		}
		if err := x.WriteEntry(Entry{Index: 37, Data: []byte("x")}, nil); !errors.Is(err, ErrClosed) {
			t.Errorf("write after close: %v", err)
		}
	})
}

func TestExportWriterRefuses(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		ctx := context.Background()
		lg, _, _ := openTest(t)
		entries := appendN(t, lg, 3)
		cp, err := lg.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pub := lg.PublicKeys()
		leaf := func(i int) []byte { h := entries[i].LeafHash(); return h[:] }
		for _, tc := range []struct {
			name  string
			write func(x *ExportWriter) error
			want  error
		}{
			{"out of order", func(x *ExportWriter) error { return x.WriteEntry(entries[1], leaf(1)) }, ErrExportFormat},
			{"short leaf hash", func(x *ExportWriter) error { return x.WriteEntry(entries[0], leaf(0)[:31]) }, ErrExportFormat},
			{"empty entry", func(x *ExportWriter) error { return x.WriteEntry(Entry{Index: 0}, nil) }, ErrMalformedEntry},
			{"too few", func(x *ExportWriter) error {
				if err := x.WriteEntry(entries[0], leaf(0)); err != nil {
					return err
				}
				return x.Close()
			}, ErrExportFormat},
			{"too many", func(x *ExportWriter) error {
				for i := range 3 {
					if err := x.WriteEntry(entries[i], leaf(i)); err != nil {
						return err
					}
				}
				return x.WriteEntry(Entry{Index: 3, Data: entries[0].Data}, nil)
			}, ErrExportFormat},
		} {
			t.Run(tc.name, func(t *testing.T) {
				x, err := NewExportWriter(io.Discard, pub, [][]byte{cp.Note}, 3)
				if err != nil {
					t.Fatal(err)
				}
				if err := tc.write(x); !errors.Is(err, tc.want) {
					t.Fatalf("err = %v, want %v", err, tc.want)
				}
				if err := x.Close(); !errors.Is(err, tc.want) {
					t.Errorf("close after failure = %v, want the first error", err)
				}
			})
		}

		for _, tc := range []struct {
			name string
			pub  PublicKeys
			cps  [][]byte
			want error
		}{
			{"no entry key", PublicKeys{Origin: pub.Origin, VerifierKey: pub.VerifierKey}, nil, ErrInvalidKeys},
			{"no verifier key", PublicKeys{Origin: pub.Origin, Entry: pub.Entry}, nil, ErrInvalidKeys},
			{"empty checkpoint", pub, [][]byte{cp.Note, nil}, ErrExportFormat},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := NewExportWriter(io.Discard, tc.pub, tc.cps, 0); !errors.Is(err, tc.want) {
					t.Fatalf("err = %v, want %v", err, tc.want)
				}
			})
		}
	})
}
