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

// WithAudit serves AuditService over lg: reads, and the witnesses'
// cosignatures (AddCosignature). Without it the service is not registered
// and clients get UNIMPLEMENTED.
func WithAudit(lg *audit.Log) Option {
	return func(c *config) { c.audit = lg }
}

// auditServer implements AuditService over an audit log. It only reads
// and stores cosignatures; entries are recorded by the server's components
// and by AuditInterceptor.
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
	cosigned, err := s.lg.CosignedNote(ctx, cp)
	if err != nil {
		return nil, s.status(ctx, op, err)
	}
	return &pb.GetCheckpointResponse{Checkpoint: &pb.Checkpoint{Note: cp.Note, CosignedNote: cosigned}}, nil
}

// Results of AddCosignature, the label of the cosignature counter.
const (
	CosignatureAccepted       = "accepted"
	CosignatureInvalid        = "invalid"
	CosignatureUnknownWitness = "unknown_witness"
	CosignatureNotIssued      = "not_issued"
	CosignatureError          = "error"
)

// WithCosignatureCounter has AddCosignature call count with the result of
// every call (one of the Cosignature* constants), for a metric.
func WithCosignatureCounter(count func(result string)) Option {
	return func(c *config) { c.cosignatures = count }
}

// AddCosignature stores a witness's cosignature of one of the log's
// checkpoints. It is public (the witness's signature is the credential)
// and records nothing in the log: cosignatures are not events.
func (s *auditServer) AddCosignature(ctx context.Context, req *pb.AddCosignatureRequest) (*pb.AddCosignatureResponse, error) {
	const op = "add audit cosignature"
	res, result, err := s.addCosignature(ctx, op, req.GetNote())
	if count := s.service.cfg.cosignatures; count != nil {
		count(result)
	}
	log := s.service.cfg.log
	if err != nil {
		log.DebugContext(ctx, "audit cosignature refused", "result", result, "err", err)
		return nil, err
	}
	log.DebugContext(ctx, "audit cosignature", "witness", res.GetWitness(), "size", res.GetTreeSize(), "time", res.GetTime().AsTime())
	return res, nil
}

func (s *auditServer) addCosignature(ctx context.Context, op string, note []byte) (*pb.AddCosignatureResponse, string, error) {
	switch {
	case len(note) == 0:
		return nil, CosignatureInvalid, invalid(op, "note is required: a checkpoint note of this log with the witness's cosignature line")
	case len(note) > audit.MaxNoteBytes:
		return nil, CosignatureInvalid, invalid(op, fmt.Sprintf("note of %d bytes is longer than %d", len(note), audit.MaxNoteBytes))
	}
	cs, err := s.lg.AddCosignature(ctx, note)
	switch {
	case err == nil:
		return &pb.AddCosignatureResponse{Witness: cs.Witness, TreeSize: cs.Size, Time: timestamppb.New(cs.Time)}, CosignatureAccepted, nil
	case errors.Is(err, audit.ErrUnknownWitness):
		return nil, CosignatureUnknownWitness, status.Error(codes.PermissionDenied,
			op+": this server does not accept the witness (fleetlearn-server --audit-witness names those it does): "+err.Error())
	case errors.Is(err, audit.ErrNotFound):
		return nil, CosignatureNotIssued, status.Error(codes.FailedPrecondition,
			op+": the log never issued this checkpoint: "+err.Error())
	case errors.Is(err, audit.ErrBadCheckpoint), errors.Is(err, audit.ErrBadCosignature), errors.Is(err, audit.ErrTooLarge):
		return nil, CosignatureInvalid, invalid(op, err.Error())
	}
	return nil, CosignatureError, s.status(ctx, op, err)
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
		CheckpointVerifierKey: pub.VerifierKey, WitnessVerifierKeys: s.lg.Witnesses()}, nil
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
