package objfetch_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/internal/natstest"
	"github.com/fleetlearn/fleetlearn/internal/objfetch"
)

func TestGet(t *testing.T) {
	ctx := t.Context()
	js := natstest.JetStream(t)
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "blobs"})
	if err != nil {
		t.Fatal(err)
	}
	// Several chunks (the default chunk is 128 KiB), with other objects'
	// chunks interleaved in the stream, and one object replaced.
	big := bytes.Repeat([]byte("0123456789abcdef"), 40_000)
	put := func(name string, b []byte) {
		t.Helper()
		if _, err := obs.PutBytes(ctx, name, b); err != nil {
			t.Fatal(err)
		}
	}
	put("small", []byte("hello"))
	put("big", big)
	put("empty", nil)
	put("small", []byte("hello again"))

	bk, err := objfetch.Open(ctx, js, "blobs")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		want []byte
	}{{"big", big}, {"small", []byte("hello again")}, {"empty", nil}} {
		got, err := bk.Get(ctx, tc.name, 1<<30)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !bytes.Equal(got, tc.want) {
			t.Fatalf("%s: got %d bytes, want %d", tc.name, len(got), len(tc.want))
		}
	}
	if _, err := bk.Get(ctx, "big", 1000); !errors.Is(err, objfetch.ErrTooLarge) {
		t.Fatalf("over the limit: err %v, want ErrTooLarge", err)
	}
	if _, err := bk.Get(ctx, "missing", 1<<30); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("missing object: err %v, want ErrObjectNotFound", err)
	}
	if err := obs.Delete(ctx, "small"); err != nil {
		t.Fatal(err)
	}
	if _, err := bk.Get(ctx, "small", 1<<30); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Fatalf("deleted object: err %v, want ErrObjectNotFound", err)
	}
	if _, err := objfetch.Open(ctx, js, "nope"); err == nil {
		t.Fatal("opening a missing bucket succeeded")
	}
	ctx2, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := bk.Get(ctx2, "big", 1<<30); err == nil {
		t.Fatal("cancelled context: no error")
	}
}
