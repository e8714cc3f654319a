package api

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

type modelServer struct {
	apiv1.UnimplementedModelServiceServer
	*service
}

func (s *modelServer) ImportModel(stream grpc.ClientStreamingServer[pb.ImportModelRequest, pb.ImportModelResponse]) error {
	const op = "import model"
	ctx := stream.Context()
	release, err := s.startUpload(ctx, op)
	if err != nil {
		return err
	}
	defer release()
	h, r, err := streamUpload(op, s.cfg.maxModelBytes, stream.Recv,
		func(m *pb.ImportModelRequest) (*pb.ImportModelHeader, bool, []byte) {
			return m.GetHeader(), m.GetHeader() != nil, m.GetChunk()
		},
		func(h *pb.ImportModelHeader) error { return checkImportHeader(op, h) })
	if err != nil {
		return err
	}
	// The backend reads the upload as it arrives; if the upload itself
	// failed (cut short, over the limit, another digest), that is the
	// reason, whatever the backend made of the bytes it got.
	m, err := s.b.ImportModel(ctx, h, r)
	if uerr := r.failed(); uerr != nil {
		return uerr
	}
	if err != nil {
		return s.toStatus(ctx, op, err)
	}
	if !r.verified() {
		s.cfg.log.ErrorContext(ctx, "request failed", "op", op, "err", "the backend kept a model before reading the whole upload")
		return status.Error(codes.Internal, op+": internal error")
	}
	return stream.SendAndClose(&pb.ImportModelResponse{Model: m})
}

func checkImportHeader(op string, h *pb.ImportModelHeader) error {
	if err := checkID(op, "header.name", h.GetName()); err != nil {
		return err
	}
	if err := checkName(op, "header.version", h.GetVersion()); err != nil {
		return err
	}
	if err := checkName(op, "header.parent_version", h.GetParentVersion()); err != nil {
		return err
	}
	if err := checkSHA256(op, "header.sha256", h.GetSha256(), false); err != nil {
		return err
	}
	return checkText(op, "header.description", h.GetDescription(), maxTextLen)
}

func (s *modelServer) ExportModel(req *pb.ExportModelRequest, stream grpc.ServerStreamingServer[pb.ExportModelResponse]) error {
	const op = "export model"
	ctx := stream.Context()
	if err := checkID(op, "version", req.GetVersion()); err != nil {
		return err
	}
	m, data, err := s.b.ExportModel(ctx, req.GetVersion())
	if err != nil {
		return s.toStatus(ctx, op, err)
	}
	if err := stream.Send(&pb.ExportModelResponse{Part: &pb.ExportModelResponse_Model{Model: m}}); err != nil {
		return err
	}
	for len(data) > 0 {
		n := min(len(data), ChunkBytes)
		if err := stream.Send(&pb.ExportModelResponse{Part: &pb.ExportModelResponse_Chunk{Chunk: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func (s *modelServer) GetModel(ctx context.Context, req *pb.GetModelRequest) (*pb.GetModelResponse, error) {
	const op = "get model"
	if err := checkID(op, "version", req.GetVersion()); err != nil {
		return nil, err
	}
	m, err := s.b.GetModel(ctx, req.GetVersion())
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.GetModelResponse{Model: m}, nil
}

func (s *modelServer) ListModels(ctx context.Context, req *pb.ListModelsRequest) (*pb.ListModelsResponse, error) {
	const op = "list models"
	p, err := page(op, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	if err := checkName(op, "name", req.GetName()); err != nil {
		return nil, err
	}
	ms, next, err := s.b.ListModels(ctx, req.GetName(), p)
	if err != nil {
		return nil, s.toStatus(ctx, op, err)
	}
	return &pb.ListModelsResponse{Models: ms, NextPageToken: next}, nil
}
