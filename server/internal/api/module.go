package api

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

type moduleServer struct {
	apiv1.UnimplementedModuleServiceServer
	*service
}

func (s *moduleServer) RegisterModule(stream grpc.ClientStreamingServer[pb.RegisterModuleRequest, pb.RegisterModuleResponse]) error {
	const op = "register module"
	ctx := stream.Context()
	release, err := s.startUpload(ctx, op)
	if err != nil {
		return err
	}
	defer release()
	h, code, sum, err := receiveUpload(op, s.cfg.maxModuleBytes, stream.Recv,
		func(m *pb.RegisterModuleRequest) (*pb.RegisterModuleHeader, bool, []byte) {
			return m.GetHeader(), m.GetHeader() != nil, m.GetChunk()
		},
		func(h *pb.RegisterModuleHeader) error { return checkModuleHeader(op, h) })
	if err != nil {
		return err
	}
	h = proto.CloneOf(h)
	h.SizeBytes = uint64(len(code))
	h.Sha256 = sum
	m, err := s.b.RegisterModule(ctx, h, code)
	if err != nil {
		return s.toStatus(ctx, op, err)
	}
	return stream.SendAndClose(&pb.RegisterModuleResponse{Module: m})
}

func checkModuleHeader(op string, h *pb.RegisterModuleHeader) error {
	if err := checkID(op, "header.name", h.GetName()); err != nil {
		return err
	}
	if err := checkSHA256(op, "header.sha256", h.GetSha256(), false); err != nil {
		return err
	}
	if n := len(h.GetSignature()); n > maxSignatureBytes {
		return invalid(op, fmt.Sprintf("header.signature is longer than %d bytes", maxSignatureBytes))
	}
	return nil
}

func (s *moduleServer) GetModule(ctx context.Context, req *pb.GetModuleRequest) (*pb.GetModuleResponse, error) {
	const op = "get module"
	if err := checkSHA256(op, "sha256", req.GetSha256(), true); err != nil {
		return nil, err
	}
	m, err := s.b.GetModule(ctx, req.GetSha256())
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.GetModuleResponse{Module: m}, nil
}

func (s *moduleServer) ListModules(ctx context.Context, req *pb.ListModulesRequest) (*pb.ListModulesResponse, error) {
	const op = "list modules"
	p, err := page(op, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	if err := checkName(op, "name", req.GetName()); err != nil {
		return nil, err
	}
	ms, next, err := s.b.ListModules(ctx, req.GetName(), p)
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.ListModulesResponse{Modules: ms, NextPageToken: next}, nil
}
