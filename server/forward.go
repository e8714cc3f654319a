package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/handoff"
	"github.com/fleetlearn/fleetlearn/server/internal/authz"
)

// A standby serves the API by forwarding each call, as it came, to the
// leader (the address the leader put in the lease), and the leader's
// answer, as it came, back: any replica serves the API, while one alone
// runs rounds and writes the audit log. The standby checks the caller's
// token and the method's roles first, so that a caller the leader would
// refuse costs the leader nothing; the leader checks them again, and
// records the call in the audit log, as for a call made to it directly.
//
// Once the replica leads, its own API takes over the same socket
// (internal/handoff); calls being forwarded then end with Unavailable, as
// the leader they went to is gone, and clients retry.

// forwardedBy is the metadata key naming the standby that forwarded a
// call. A standby refuses a call another forwarded: the two take each
// other for the leader (an API address that leads back to a standby), and
// forwarding on would go round in circles.
const forwardedBy = "fleetlearn-forwarded-by"

// maxForwardStreams bounds the calls one client connection may have in
// flight through a standby.
const maxForwardStreams = 256

// startStandbyAPI serves the gRPC port with the forwarder until
// stopStandbyAPI.
func (s *Server) startStandbyAPI() error {
	az, err := authz.New(s.apiVerifier, identity.DefaultPolicy())
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	s.forward = &forwarder{s: s}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxAPIMessage), // as the API itself
		grpc.MaxConcurrentStreams(maxForwardStreams),
		grpc.ForceServerCodecV2(rawCodec{}),
		grpc.UnknownServiceHandler(s.forward.stream),
		grpc.ChainStreamInterceptor(az.AuthenticateStream, az.AuthorizeStream),
	}
	if !s.cfg.GRPCInsecure {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tlsCA.ServerConfig(false))))
	}
	s.grpcHandoff = handoff.New(s.grpcLn)
	s.standbyAPI = grpc.NewServer(opts...)
	go s.standbyAPI.Serve(s.grpcHandoff.Lend())
	return nil
}

// stopStandbyAPI ends the forwarding at once: the replica now leads, and
// the leader the calls went to is gone. Safe to call more than once.
func (s *Server) stopStandbyAPI() {
	if s.standbyAPI != nil {
		s.standbyAPI.Stop()
	}
	if s.forward != nil {
		s.forward.close()
	}
}

// forwarder forwards API calls to the leader of the moment.
type forwarder struct {
	s *Server

	mu   sync.Mutex
	addr string // the leader's address conn dials
	conn *grpc.ClientConn
}

// leader returns a connection to the leader's API and its address.
func (f *forwarder) leader() (*grpc.ClientConn, string, error) {
	st := f.s.standby.Load()
	switch {
	case st == nil:
		return nil, "", status.Error(codes.Unavailable, "standby: no leader known yet; try again")
	case st.err != "":
		return nil, "", status.Errorf(codes.Unavailable, "standby: cannot read the lease to find the leader: %s", st.err)
	case st.address == "":
		return nil, "", status.Errorf(codes.Unavailable, "standby: the leader %q gave no API address; call it directly", st.holder)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil && f.addr == st.address {
		return f.conn, f.addr, nil
	}
	if f.conn != nil {
		f.conn.Close()
		f.conn = nil
	}
	// The leader's certificate comes from the CA every replica shares, for
	// the host it advertises. The caller's token travels in the forwarded
	// metadata, so the connection has none of its own.
	conn, err := client.Dial(st.address, append(f.s.apiDialOptions(),
		client.WithGRPCOptions(grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxAPIMessage))))...)
	if err != nil {
		return nil, "", status.Errorf(codes.Unavailable, "standby: leader %s at %s: %v", st.holder, st.address, err)
	}
	f.conn, f.addr = conn, st.address
	return conn, st.address, nil
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil {
		f.conn.Close()
		f.conn = nil
	}
}

// stream forwards one call, of any kind (unary calls are streams of one
// message each way on the wire).
func (f *forwarder) stream(_ any, in grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(in)
	if !ok {
		return status.Error(codes.Internal, "standby: call without a method")
	}
	md, _ := metadata.FromIncomingContext(in.Context())
	if by := md.Get(forwardedBy); len(by) > 0 {
		return status.Errorf(codes.Unavailable, "standby %s: replica %s forwarded this call here, taking this standby for the leader: "+
			"its lease names an API address (--api-advertise) that leads to a standby", f.s.cfg.ReplicaName, by[0])
	}
	conn, addr, err := f.leader()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(in.Context())
	defer cancel()
	fwd := forwardable(md)
	fwd.Set(forwardedBy, f.s.cfg.ReplicaName)
	ctx = metadata.NewOutgoingContext(ctx, fwd)
	out, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method,
		grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return leaderError(err, addr)
	}
	// Caller to leader. A caller's failure (or its going away) cancels
	// the leader's side too.
	go func() {
		for {
			var m frame
			if err := in.RecvMsg(&m); err != nil {
				if errors.Is(err, io.EOF) {
					out.CloseSend()
				} else {
					cancel()
				}
				return
			}
			if err := out.SendMsg(&m); err != nil {
				// The leader ended the call: its status comes from RecvMsg.
				return
			}
		}
	}()
	// Leader to caller.
	headed := false
	for {
		var m frame
		err := out.RecvMsg(&m)
		if !headed {
			headed = true
			if h, herr := out.Header(); herr == nil && len(h) > 0 {
				if err := in.SendHeader(h); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) {
			in.SetTrailer(out.Trailer())
			return nil
		}
		if err != nil {
			in.SetTrailer(out.Trailer())
			return leaderError(err, addr)
		}
		if err := in.SendMsg(&m); err != nil {
			return err
		}
	}
}

// leaderError passes the leader's status on as it is; a leader that could
// not be reached is said to be so.
func leaderError(err error, addr string) error {
	st, ok := status.FromError(err)
	if !ok {
		return status.Errorf(codes.Unavailable, "standby: forwarding to the leader at %s: %v", addr, err)
	}
	if st.Code() == codes.Unavailable && !strings.HasPrefix(st.Message(), "standby") {
		return status.Errorf(codes.Unavailable, "standby: the leader at %s is unreachable (%s); a standby takes over within the lease ttl, try again",
			addr, st.Message())
	}
	return st.Err()
}

// forwardable is the caller's metadata less what gRPC sets per connection
// (pseudo-headers, content type, user agent, its own reserved keys).
func forwardable(md metadata.MD) metadata.MD {
	out := metadata.MD{}
	for k, v := range md {
		if strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-") || k == "content-type" || k == "user-agent" || k == "te" {
			continue
		}
		out[k] = v
	}
	return out
}

// frame is one message, its bytes as they crossed the wire.
type frame struct{ b []byte }

// rawCodec moves messages without decoding them. It is named "proto" so
// that the leader, and the caller, see the content type they sent.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("standby: forward codec: %T is not a frame", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("standby: forward codec: %T is not a frame", v)
	}
	f.b = data.Materialize() // a copy: data is freed on return
	return nil
}

func (rawCodec) Name() string { return "proto" }
