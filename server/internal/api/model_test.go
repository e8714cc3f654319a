package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/fleetlearn/fleetlearn/client"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/api"
	"github.com/fleetlearn/fleetlearn/server/internal/api/apitest"
)

func modelHeader(name string, size uint64, sha string) *pb.ImportModelRequest {
	return &pb.ImportModelRequest{Part: &pb.ImportModelRequest_Header{
		Header: &pb.ImportModelHeader{Name: name, SizeBytes: size, Sha256: sha}}}
}

func modelChunk(b []byte) *pb.ImportModelRequest {
	return &pb.ImportModelRequest{Part: &pb.ImportModelRequest_Chunk{Chunk: b}}
}

func moduleHeader(name string, size uint64, sha string) *pb.RegisterModuleRequest {
	return &pb.RegisterModuleRequest{Part: &pb.RegisterModuleRequest_Header{
		Header: &pb.RegisterModuleHeader{Name: name, SizeBytes: size, Sha256: sha, AbiVersion: 1}}}
}

func moduleChunk(b []byte) *pb.RegisterModuleRequest {
	return &pb.RegisterModuleRequest{Part: &pb.RegisterModuleRequest_Chunk{Chunk: b}}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// pattern returns n bytes that differ from chunk to chunk.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>20)
	}
	return b
}

func TestImportExportModel(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	data := pattern(2*api.ChunkBytes + api.ChunkBytes/2)
	msgs := []*pb.ImportModelRequest{modelHeader("mnist", uint64(len(data)), sha(data))}
	for rest := data; len(rest) > 0; {
		n := min(len(rest), api.ChunkBytes)
		msgs = append(msgs, modelChunk(rest[:n]))
		rest = rest[n:]
	}
	st, err := e.models.ImportModel(ctx)
	res, err := upload(t, st, err, msgs)
	if err != nil {
		t.Fatal(err)
	}
	m := res.GetModel()
	if m.GetRef().GetVersion() != "mnist@1" || m.GetRef().GetSha256() != sha(data) || m.GetRef().GetSizeBytes() != uint64(len(data)) {
		t.Fatalf("imported %v", m)
	}

	g, err := e.models.GetModel(ctx, &pb.GetModelRequest{Version: "mnist@1"})
	if err != nil || g.GetModel().GetName() != "mnist" {
		t.Fatalf("GetModel = %v, %v", g, err)
	}
	l, err := e.models.ListModels(ctx, &pb.ListModelsRequest{Name: "mnist"})
	if err != nil || len(l.GetModels()) != 1 {
		t.Fatalf("ListModels = %v, %v", l, err)
	}

	stream, err := e.models.ExportModel(ctx, &pb.ExportModelRequest{Version: "mnist@1"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.GetModel().GetRef().GetVersion() != "mnist@1" {
		t.Fatalf("first message = %v, want the model metadata", first)
	}
	var got []byte
	var sizes []int
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.GetModel() != nil {
			t.Fatal("metadata sent twice")
		}
		sizes = append(sizes, len(r.GetChunk()))
		got = append(got, r.GetChunk()...)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("exported %d bytes, want the %d imported", len(got), len(data))
	}
	if want := []int{api.ChunkBytes, api.ChunkBytes, api.ChunkBytes / 2}; !slices.Equal(sizes, want) {
		t.Errorf("chunk sizes = %v, want %v", sizes, want)
	}
}

func TestImportModelWithoutDeclaredSizeOrDigest(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	data := []byte("safetensors bytes")
	st, err := e.models.ImportModel(ctx)
	res, err := upload(t, st, err, []*pb.ImportModelRequest{modelHeader("m", 0, ""), modelChunk(data[:5]), modelChunk(nil), modelChunk(data[5:])})
	if err != nil {
		t.Fatal(err)
	}
	// The backend is told what arrived.
	if r := res.GetModel().GetRef(); r.GetSha256() != sha(data) || r.GetSizeBytes() != uint64(len(data)) {
		t.Errorf("ref = %v", r)
	}
	// Versions are unique.
	h := modelHeader("m", 0, "")
	h.GetHeader().Version = "m@1"
	st, err = e.models.ImportModel(ctx)
	_, err = upload(t, st, err, []*pb.ImportModelRequest{h, modelChunk(data)})
	wantCode(t, err, codes.AlreadyExists)
}

func TestExportUnknownModel(t *testing.T) {
	e := newEnv(t)
	s, err := e.models.ExportModel(testContext(t), &pb.ExportModelRequest{Version: "nope@1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Recv()
	wantCode(t, err, codes.NotFound)
}

// part is one message of an upload, independent of the RPC.
type part struct {
	header bool
	name   string
	size   uint64
	sha    string
	chunk  []byte
}

func hdr(size uint64, sha string) part { return part{header: true, name: "n", size: size, sha: sha} }
func chunk(b []byte) part              { return part{chunk: b} }

// TestUploadStreams runs every malformed-stream case against both uploads.
func TestUploadStreams(t *testing.T) {
	const limit = 64
	data := []byte("0123456789")
	big := make([]byte, limit+1)
	for _, tc := range []struct {
		name  string
		parts []part
		code  codes.Code
		msg   string
	}{
		{"valid", []part{hdr(10, sha(data)), chunk(data[:4]), chunk(data[4:])}, codes.OK, ""},
		{"empty stream", nil, codes.InvalidArgument, "missing header"},
		{"chunk before header", []part{chunk(data), hdr(10, "")}, codes.InvalidArgument, "missing header"},
		{"header twice", []part{hdr(10, ""), chunk(data[:2]), hdr(10, "")}, codes.InvalidArgument, "header sent twice"},
		{"no data", []part{hdr(0, "")}, codes.InvalidArgument, "no data"},
		{"shorter than declared", []part{hdr(11, ""), chunk(data)}, codes.InvalidArgument, "received 10 bytes, header declared 11"},
		{"longer than declared", []part{hdr(9, ""), chunk(data)}, codes.InvalidArgument, "more than the declared 9 bytes"},
		{"digest mismatch", []part{hdr(10, sha([]byte("other"))), chunk(data)}, codes.InvalidArgument, "sha256 mismatch"},
		{"malformed digest", []part{hdr(10, "XYZ"), chunk(data)}, codes.InvalidArgument, "header.sha256"},
		{"no name", []part{{header: true, size: 10}, chunk(data)}, codes.InvalidArgument, "header.name is required"},
		{"declared over the limit", []part{hdr(limit+1, ""), chunk(data)}, codes.ResourceExhausted, "declared size 65 bytes exceeds the 64 byte limit"},
		{"sent over the limit", []part{hdr(0, ""), chunk(big[:limit]), chunk(big[limit:])}, codes.ResourceExhausted, "exceeds the 64 byte limit"},
		{"chunk too large", []part{hdr(0, ""), chunk(make([]byte, api.ChunkBytes+1))}, codes.InvalidArgument, "exceeds 1048576 bytes"},
	} {
		for _, rpc := range []string{"import model", "register module"} {
			t.Run(rpc+"/"+tc.name, func(t *testing.T) {
				e := newEnv(t, api.WithMaxModelBytes(limit), api.WithMaxModuleBytes(limit))
				ctx := testContext(t)
				var err error
				if rpc == "import model" {
					var msgs []*pb.ImportModelRequest
					for _, p := range tc.parts {
						if p.header {
							m := modelHeader(p.name, p.size, p.sha)
							msgs = append(msgs, m)
						} else {
							msgs = append(msgs, modelChunk(p.chunk))
						}
					}
					st, serr := e.models.ImportModel(ctx)
					_, err = upload(t, st, serr, msgs)
				} else {
					var msgs []*pb.RegisterModuleRequest
					for _, p := range tc.parts {
						if p.header {
							msgs = append(msgs, moduleHeader(p.name, p.size, p.sha))
						} else {
							msgs = append(msgs, moduleChunk(p.chunk))
						}
					}
					st, serr := e.modules.RegisterModule(ctx)
					_, err = upload(t, st, serr, msgs)
				}
				wantCode(t, err, tc.code)
				msg := status.Convert(err).Message()
				if tc.code != codes.OK && (!strings.HasPrefix(msg, rpc+": ") || !strings.Contains(msg, tc.msg)) {
					t.Errorf("message = %q, want %q prefix and %q", msg, rpc+": ", tc.msg)
				}
			})
		}
	}
}

// gatedBackend holds each ImportModel until release is closed, after
// telling entered that the call holds its upload slot.
type gatedBackend struct {
	*apitest.Backend
	entered chan string
	release chan struct{}
}

func (b *gatedBackend) ImportModel(ctx context.Context, h *pb.ImportModelHeader, r io.Reader) (*pb.Model, error) {
	b.entered <- h.GetName()
	<-b.release
	return b.Backend.ImportModel(ctx, h, r)
}

// TestUploadSlots: with one upload per caller and two in all, a caller's
// second upload is refused while its first is in flight, another caller's
// goes through, a third caller is refused by the total, and every slot
// comes back once the uploads end, refusals included.
func TestUploadSlots(t *testing.T) {
	b := &gatedBackend{Backend: apitest.New(), entered: make(chan string, 4), release: make(chan struct{})}
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	api.Register(s, b, api.WithUploadLimits(1, 2), api.WithCaller(func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		return strings.Join(md.Get("caller"), "")
	}))
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	models := apiv1.NewModelServiceClient(conn)
	as := func(caller string) context.Context {
		return metadata.AppendToOutgoingContext(testContext(t), "caller", caller)
	}
	data := pattern(100)
	imp := func(caller, name string) error {
		_, err := client.ImportModel(as(caller), models, &pb.ImportModelHeader{Name: name}, bytes.NewReader(data))
		return err
	}
	done := make(chan error, 2)
	go func() { done <- imp("olga", "a") }()
	if got := <-b.entered; got != "a" {
		t.Fatalf("entered %q", got)
	}
	err = imp("olga", "b")
	wantCode(t, err, codes.ResourceExhausted)
	if !strings.Contains(err.Error(), "olga already has 1 uploads in flight") {
		t.Fatalf("per-caller refusal: %v", err)
	}
	go func() { done <- imp("otto", "c") }()
	if got := <-b.entered; got != "c" {
		t.Fatalf("entered %q", got)
	}
	err = imp("ada", "d")
	wantCode(t, err, codes.ResourceExhausted)
	if !strings.Contains(err.Error(), "the server is receiving 2 uploads") {
		t.Fatalf("total refusal: %v", err)
	}
	close(b.release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := imp("olga", "b"); err != nil {
		t.Fatalf("after the uploads ended: %v", err)
	}
	if err := imp("ada", "d"); err != nil {
		t.Fatalf("ada after the uploads ended: %v", err)
	}
}
