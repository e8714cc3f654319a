// Package client holds the Go side of Fleetlearn's API that takes more than
// one line: dialing with TLS and a bearer token (Dial), uploading models and
// modules in chunks and downloading model exports. The CLI, the demo and
// tests use it.
package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// ChunkBytes is the upload chunk size; the API refuses larger chunks.
const ChunkBytes = 1 << 20

// ErrProtocol reports a server that broke the streaming protocol.
var ErrProtocol = errors.New("client: protocol error")

func sendChunks(r io.Reader, send func([]byte) error) error {
	buf := make([]byte, ChunkBytes)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if serr := send(buf[:n]); serr != nil {
				return serr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// ImportModel streams safetensors bytes from r after the header.
func ImportModel(ctx context.Context, c apiv1.ModelServiceClient, h *pb.ImportModelHeader, r io.Reader) (*pb.Model, error) {
	st, err := c.ImportModel(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&pb.ImportModelRequest{Part: &pb.ImportModelRequest_Header{Header: h}}); err != nil {
		return nil, closeErr(st.CloseAndRecv, err)
	}
	if err := sendChunks(r, func(b []byte) error {
		return st.Send(&pb.ImportModelRequest{Part: &pb.ImportModelRequest_Chunk{Chunk: b}})
	}); err != nil {
		return nil, closeErr(st.CloseAndRecv, err)
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return resp.GetModel(), nil
}

// RegisterModule streams WASM bytes from r after the header.
func RegisterModule(ctx context.Context, c apiv1.ModuleServiceClient, h *pb.RegisterModuleHeader, r io.Reader) (*pb.Module, error) {
	st, err := c.RegisterModule(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&pb.RegisterModuleRequest{Part: &pb.RegisterModuleRequest_Header{Header: h}}); err != nil {
		return nil, closeErr(st.CloseAndRecv, err)
	}
	if err := sendChunks(r, func(b []byte) error {
		return st.Send(&pb.RegisterModuleRequest{Part: &pb.RegisterModuleRequest_Chunk{Chunk: b}})
	}); err != nil {
		return nil, closeErr(st.CloseAndRecv, err)
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return resp.GetModule(), nil
}

// closeErr prefers the server's status (the real reason a Send failed,
// which gRPC reports as io.EOF) over the local error.
func closeErr[T any](closeAndRecv func() (T, error), sendErr error) error {
	if _, err := closeAndRecv(); err != nil {
		return err
	}
	return sendErr
}

// ExportModel downloads a model version: its metadata and safetensors bytes
// written to w. maxBytes bounds the download (0: no bound).
func ExportModel(ctx context.Context, c apiv1.ModelServiceClient, version string, w io.Writer, maxBytes int64) (*pb.Model, error) {
	st, err := c.ExportModel(ctx, &pb.ExportModelRequest{Version: version})
	if err != nil {
		return nil, err
	}
	first, err := st.Recv()
	if err != nil {
		return nil, err
	}
	m := first.GetModel()
	if m == nil {
		return nil, fmt.Errorf("%w: export did not start with the model's metadata", ErrProtocol)
	}
	var n int64
	h := sha256.New()
	for {
		part, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		chunk := part.GetChunk()
		if part.GetModel() != nil {
			return nil, fmt.Errorf("%w: metadata repeated mid-export", ErrProtocol)
		}
		n += int64(len(chunk))
		if maxBytes > 0 && n > maxBytes {
			return nil, fmt.Errorf("%w: export exceeds %d bytes", ErrProtocol, maxBytes)
		}
		if uint64(n) > m.GetRef().GetSizeBytes() {
			return nil, fmt.Errorf("%w: more than the announced %d bytes", ErrProtocol, m.GetRef().GetSizeBytes())
		}
		h.Write(chunk)
		if _, err := w.Write(chunk); err != nil {
			return nil, err
		}
	}
	got := hex.EncodeToString(h.Sum(nil))
	if want := m.GetRef().GetSizeBytes(); uint64(n) != want || (m.GetRef().GetSha256() != "" && got != m.GetRef().GetSha256()) {
		return nil, fmt.Errorf("%w: received %d bytes with sha256 %s, announced %d bytes with sha256 %s",
			ErrProtocol, n, got, want, m.GetRef().GetSha256())
	}
	return m, nil
}

// ExportModelBytes is ExportModel into memory.
func ExportModelBytes(ctx context.Context, c apiv1.ModelServiceClient, version string, maxBytes int64) (*pb.Model, []byte, error) {
	var buf bytes.Buffer
	m, err := ExportModel(ctx, c, version, &buf, maxBytes)
	return m, buf.Bytes(), err
}
