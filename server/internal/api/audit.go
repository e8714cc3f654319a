package api

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/audit"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Limits of the audit service.
const (
	// ExportChunkEntries is the most entries one ExportEntries message
	// carries; ExportChunkBytes (of entry bytes) closes a chunk earlier.
	ExportChunkEntries = 512
	ExportChunkBytes   = 1 << 20
)

// WithAudit serves AuditService, read-only, over lg. Without it the service
// is not registered and clients get UNIMPLEMENTED.
func WithAudit(lg *audit.Log) Option {
	return func(c *config) { c.audit = lg }
}

// auditServer implements AuditService over an audit log. It only reads;
// entries are recorded by the server's components and by AuditInterceptor.
type auditServer struct {
	apiv1.UnimplementedAuditServiceServer
	service *service
	lg      *audit.Log
}

func (s *auditServer) QueryEntries(ctx context.Context, req *pb.QueryEntriesRequest) (*pb.QueryEntriesResponse, error) {
	const op = "query audit entries"
	p, err := page(op, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	f, err := auditFilter(op, req.GetFilter())
	if err != nil {
		return nil, err
	}
	res, err := s.lg.Query(ctx, f, p.Size, p.Token)
	if err != nil {
		return nil, s.status(ctx, op, err)
	}
	out := &pb.QueryEntriesResponse{Entries: make([]*pb.AuditEntry, len(res.Entries)), NextPageToken: res.Next}
	for i, e := range res.Entries {
		out.Entries[i] = auditEntry(e)
	}
	return out, nil
}

func (s *auditServer) GetCheckpoint(ctx context.Context, _ *pb.GetCheckpointRequest) (*pb.GetCheckpointResponse, error) {
	const op = "get audit checkpoint"
	cp, err := s.lg.Latest(ctx)
	if errors.Is(err, audit.ErrNotFound) {
		return nil, status.Error(codes.FailedPrecondition, op+": the log has signed no checkpoint yet")
	}
	if err != nil {
		return nil, s.status(ctx, op, err)
	}
	return &pb.GetCheckpointResponse{Checkpoint: &pb.Checkpoint{Note: cp.Note}}, nil
}

func (s *auditServer) GetInclusionProof(ctx context.Context, req *pb.GetInclusionProofRequest) (*pb.GetInclusionProofResponse, error) {
	const op = "get inclusion proof"
	index, size := req.GetLeafIndex(), req.GetTreeSize()
	if index >= size {
		return nil, invalid(op, fmt.Sprintf("leaf_index %d must be below tree_size %d", index, size))
	}
	if cur := s.lg.Size(); size > cur {
		return nil, status.Errorf(codes.OutOfRange, "%s: tree_size %d beyond the log's %d entries", op, size, cur)
	}
	hashes, err := s.lg.InclusionProof(ctx, index, size)
	if err != nil {
		return nil, s.status(ctx, op, err)
	}
	return &pb.GetInclusionProofResponse{Proof: &pb.InclusionProof{LeafIndex: index, TreeSize: size, Hashes: hashes}}, nil
}

func (s *auditServer) GetConsistencyProof(ctx context.Context, req *pb.GetConsistencyProofRequest) (*pb.GetConsistencyProofResponse, error) {
	const op = "get consistency proof"
	first, second := req.GetFirst(), req.GetSecond()
	if first == 0 || first > second {
		return nil, invalid(op, fmt.Sprintf("need 1 <= first <= second, got first %d, second %d", first, second))
	}
	if cur := s.lg.Size(); second > cur {
		return nil, status.Errorf(codes.OutOfRange, "%s: second %d beyond the log's %d entries", op, second, cur)
	}
	hashes, err := s.lg.ConsistencyProof(ctx, first, second)
	if err != nil {
		return nil, s.status(ctx, op, err)
	}
	return &pb.GetConsistencyProofResponse{Proof: &pb.ConsistencyProof{First: first, Second: second, Hashes: hashes}}, nil
}

func (s *auditServer) ExportEntries(req *pb.ExportEntriesRequest, stream grpc.ServerStreamingServer[pb.ExportEntriesResponse]) error {
	const op = "export audit entries"
	ctx := stream.Context()
	start, end := req.GetStartIndex(), req.GetEndIndex()
	cur := s.lg.Size()
	if end == 0 {
		end = cur
	}
	if end > cur {
		return status.Errorf(codes.OutOfRange, "%s: end_index %d beyond the log's %d entries", op, end, cur)
	}
	if start > end {
		return invalid(op, fmt.Sprintf("start_index %d is after end_index %d", start, end))
	}
	msg := &pb.ExportEntriesResponse{}
	bytes := 0
	flush := func() error {
		if len(msg.Entries) == 0 {
			return nil
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		msg, bytes = &pb.ExportEntriesResponse{}, 0
		return nil
	}
	for e, err := range s.lg.Entries(ctx, start, end) {
		if err != nil {
			return s.status(ctx, op, err)
		}
		if len(msg.Entries) == ExportChunkEntries || bytes > 0 && bytes+len(e.Data) > ExportChunkBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		msg.Entries = append(msg.Entries, auditEntry(e))
		bytes += len(e.Data)
	}
	return flush()
}

func (s *auditServer) GetPublicKeys(ctx context.Context, _ *pb.GetPublicKeysRequest) (*pb.GetPublicKeysResponse, error) {
	const op = "get audit public keys"
	pub := s.lg.PublicKeys()
	jwks, err := pub.JWKS()
	if err != nil {
		return nil, s.status(ctx, op, err)
	}
	return &pb.GetPublicKeysResponse{Origin: pub.Origin, EntryJwks: jwks, EntryKeyId: pub.EntryKeyID,
		CheckpointVerifierKey: pub.VerifierKey}, nil
}

func auditEntry(e audit.Entry) *pb.AuditEntry {
	h := e.LeafHash()
	return &pb.AuditEntry{Index: e.Index, Jws: e.Data, LeafHash: h[:]}
}

// auditFilter turns an AuditFilter into the log's Filter. The fields are
// checked by writing the filter in the command-line syntax and parsing it
// back, so the API and the CLI accept exactly the same filters.
func auditFilter(op string, af *pb.AuditFilter) (audit.Filter, error) {
	var f audit.Filter
	if af == nil {
		return f, nil
	}
	for _, ts := range []struct {
		name string
		dst  *time.Time
		src  *timestamppb.Timestamp
	}{{"start_time", &f.Since, af.GetStartTime()}, {"end_time", &f.Until, af.GetEndTime()}} {
		if ts.src == nil {
			continue
		}
		if err := ts.src.CheckValid(); err != nil {
			return audit.Filter{}, invalid(op, "filter."+ts.name+": "+err.Error())
		}
		*ts.dst = ts.src.AsTime()
	}
	f.Task, f.Round, f.Type, f.Actor = af.GetTaskId(), af.GetRound(), audit.EventType(af.GetEventType()), af.GetActor()
	parsed, err := audit.ParseFilter(f.String())
	if err != nil {
		return audit.Filter{}, invalid(op, "filter: "+err.Error())
	}
	return parsed, nil
}

// auditCodes maps the audit package's sentinel errors to status codes; the
// first match wins.
var auditCodes = []struct {
	err  error
	code codes.Code
}{
	{audit.ErrNotFound, codes.NotFound},
	{audit.ErrInvalidFilter, codes.InvalidArgument},
	{audit.ErrInvalidProof, codes.InvalidArgument},
	{audit.ErrTooLarge, codes.InvalidArgument},
	{audit.ErrClosed, codes.Unavailable},
	// An auditor must learn that the log is damaged; the message names
	// only entries and checkpoints, nothing secret.
	{audit.ErrCorrupt, codes.DataLoss},
	{audit.ErrInconsistent, codes.DataLoss},
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
}

// status is toStatus for errors from the audit log.
func (s *auditServer) status(ctx context.Context, op string, err error) error {
	for _, m := range auditCodes {
		if errors.Is(err, m.err) {
			return status.Error(m.code, op+": "+err.Error())
		}
	}
	return s.service.toStatus(ctx, op, err)
}
