package api_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func TestModuleLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := testContext(t)
	code := []byte("\x00asm\x01\x00\x00\x00")
	h := moduleHeader("mlp", uint64(len(code)), sha(code))
	h.GetHeader().Signature = []byte("jws..sig")
	st, err := e.modules.RegisterModule(ctx)
	res, err := upload(t, st, err, []*pb.RegisterModuleRequest{h, moduleChunk(code)})
	if err != nil {
		t.Fatal(err)
	}
	ref := res.GetModule().GetRef()
	if ref.GetSha256() != sha(code) || ref.GetName() != "mlp" || ref.GetAbiVersion() != 1 || string(res.GetModule().GetSignature()) != "jws..sig" {
		t.Fatalf("registered %v", res.GetModule())
	}
	g, err := e.modules.GetModule(ctx, &pb.GetModuleRequest{Sha256: sha(code)})
	if err != nil || g.GetModule().GetRef().GetName() != "mlp" {
		t.Fatalf("GetModule = %v, %v", g, err)
	}
	l, err := e.modules.ListModules(ctx, &pb.ListModulesRequest{Name: "mlp"})
	if err != nil || len(l.GetModules()) != 1 {
		t.Fatalf("ListModules = %v, %v", l, err)
	}
	l, err = e.modules.ListModules(ctx, &pb.ListModulesRequest{Name: "other"})
	if err != nil || len(l.GetModules()) != 0 {
		t.Fatalf("ListModules(other) = %v, %v", l, err)
	}

	st, err = e.modules.RegisterModule(ctx)
	_, err = upload(t, st, err, []*pb.RegisterModuleRequest{h, moduleChunk(code)})
	wantCode(t, err, codes.AlreadyExists)

	_, err = e.modules.GetModule(ctx, &pb.GetModuleRequest{Sha256: sha([]byte("nothing"))})
	wantCode(t, err, codes.NotFound)
}
