package ui

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetlearn/fleetlearn/audit"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// checkpointView is the log's latest checkpoint as the dashboard verified
// it with the keys the server publishes: the log's signature and each
// accepted witness's cosignature.
type checkpointView struct {
	Origin    string
	Size      uint64
	Root      string
	Signed    time.Time
	Note      string
	Witnesses []witnessView
	Verified  bool
	Problem   string
	// Pending says why there is no checkpoint to show.
	Pending string
}

type witnessView struct {
	Key      string
	Name     string
	Cosigned bool
	Time     time.Time
	Problem  string
}

// keys are the log's published keys, fetched once per page.
type keys struct{ *pb.GetPublicKeysResponse }

func (h *Handler) keys(ctx context.Context) (*keys, error) {
	k, err := h.audit().GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
	if err != nil {
		return nil, err
	}
	return &keys{k}, nil
}

// entryKey is the key every entry's JWS verifies with.
func (k *keys) entryKey() (ed25519.PublicKey, error) {
	key, err := audit.ParseJWKS(k.GetEntryJwks())
	if err != nil {
		return nil, errorf("the server's entry key: %w", err)
	}
	return key, nil
}

// checkpoint fetches the latest checkpoint and verifies it with k. A
// checkpoint that does not verify is shown as such, not hidden: that is
// what an auditor needs to see.
func (h *Handler) checkpoint(ctx context.Context, k *keys) (*checkpointView, error) {
	res, err := h.audit().GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
	if status.Code(err) == codes.FailedPrecondition {
		// A log that has signed nothing yet: seconds after a first start.
		return &checkpointView{Pending: status.Convert(err).Message()}, nil
	}
	if err != nil {
		return nil, err
	}
	note := res.GetCheckpoint().GetNote()
	cv := &checkpointView{Note: string(note)}
	cp, err := audit.ParseCheckpoint(note, k.GetCheckpointVerifierKey())
	if err != nil {
		cv.Problem = err.Error()
		return cv, nil
	}
	cv.Verified = true
	cv.Origin, cv.Size, cv.Root, cv.Signed = cp.Origin, cp.Size, hex.EncodeToString(cp.Root[:]), cp.Signed
	cosigned := res.GetCheckpoint().GetCosignedNote()
	for _, wk := range k.GetWitnessVerifierKeys() {
		w := witnessView{Key: wk, Name: strings.SplitN(wk, "+", 2)[0]}
		if len(cosigned) == 0 {
			w.Problem = "no cosignature yet"
		} else if wcp, at, err := audit.VerifyCosignature(cosigned, k.GetCheckpointVerifierKey(), wk); err != nil {
			w.Problem = err.Error()
		} else if wcp.Size != cp.Size || wcp.Root != cp.Root {
			w.Problem = "cosigns checkpoint " + strconv.FormatUint(wcp.Size, 10) + ", not the latest"
		} else {
			w.Cosigned, w.Time = true, at
		}
		cv.Witnesses = append(cv.Witnesses, w)
	}
	return cv, nil
}

// eventView is one verified audit entry.
type eventView struct {
	Index   uint64
	Time    time.Time
	Type    string
	Actor   string
	Task    string
	Round   uint64
	Payload string
}

// entries queries the log through the API and verifies every entry's
// signature and leaf hash, as the CLI does: the entry's bytes, not the
// server's index, are authoritative.
func (h *Handler) entries(ctx context.Context, k *keys, f *pb.AuditFilter, token string, n int) ([]eventView, string, error) {
	key, err := k.entryKey()
	if err != nil {
		return nil, "", err
	}
	var out []eventView
	req := &pb.QueryEntriesRequest{Filter: f, PageSize: int32(min(n, maxEntries)), PageToken: token}
	for {
		resp, err := h.audit().QueryEntries(ctx, req)
		if err != nil {
			return nil, "", err
		}
		for _, pe := range resp.GetEntries() {
			ev, err := verified(pe, key)
			if err != nil {
				return nil, "", err
			}
			out = append(out, viewOf(pe.GetIndex(), ev))
		}
		next := resp.GetNextPageToken()
		if next == "" || len(out) >= n {
			return out, next, nil
		}
		req.PageToken = next
	}
}

func verified(pe *pb.AuditEntry, key []byte) (audit.Event, error) {
	e := audit.Entry{Index: pe.GetIndex(), Data: pe.GetJws()}
	ev, err := audit.VerifyEntry(e, key)
	if err != nil {
		return audit.Event{}, errorf("entry %d does not verify: %w", e.Index, err)
	}
	if lh := e.LeafHash(); !bytes.Equal(pe.GetLeafHash(), lh[:]) {
		return audit.Event{}, errorf("entry %d: the server's leaf hash does not match its bytes", e.Index)
	}
	return ev, nil
}

func viewOf(i uint64, ev audit.Event) eventView {
	var pretty bytes.Buffer
	if json.Indent(&pretty, ev.Payload, "", "  ") != nil {
		pretty.Reset()
		pretty.Write(ev.Payload)
	}
	return eventView{Index: i, Time: ev.Time, Type: string(ev.Type), Actor: ev.Actor.String(),
		Task: ev.Subject.Task, Round: ev.Subject.Round, Payload: pretty.String()}
}

type auditData struct {
	Checkpoint *checkpointView
	Events     []eventView
	Denied     *denied
	Filter     auditFilter
	Next       string
	Problem    string
}

type auditFilter struct {
	Type, Task, Actor, Round string
}

func (f auditFilter) Query(next string) string {
	q := []string{}
	for _, kv := range [][2]string{{"type", f.Type}, {"task", f.Task}, {"actor", f.Actor}, {"round", f.Round}, {"page", next}} {
		if kv[1] != "" {
			q = append(q, kv[0]+"="+url.QueryEscape(kv[1]))
		}
	}
	return strings.Join(q, "&")
}

func (h *Handler) auditPage(r *http.Request, v *viewer) (string, frame, error) {
	ctx := v.ctx(r)
	k, err := h.keys(ctx)
	if err != nil {
		return "", frame{}, err
	}
	cp, err := h.checkpoint(ctx, k)
	if err != nil {
		return "", frame{}, err
	}
	q := r.URL.Query()
	d := auditData{Checkpoint: cp, Filter: auditFilter{Type: clip(q.Get("type"), 64), Task: clip(q.Get("task"), 128),
		Actor: clip(q.Get("actor"), 200), Round: clip(q.Get("round"), 20)}}
	f := &pb.AuditFilter{EventType: d.Filter.Type, TaskId: d.Filter.Task, Actor: d.Filter.Actor}
	if d.Filter.Round != "" {
		n, err := strconv.ParseUint(d.Filter.Round, 10, 64)
		if err != nil {
			d.Problem = "round must be a number"
			return "audit", frame{Title: "Audit log", Nav: "audit", Data: d}, nil
		}
		f.Round = n
	}
	evs, next, err := h.entries(ctx, k, f, clip(q.Get("page"), 200), maxEntries)
	switch {
	case err == nil:
		d.Events, d.Next = evs, next
	default:
		den, err2 := h.section(v, err)
		switch {
		case err2 == nil:
			d.Denied = den
		case status.Code(err2) == codes.InvalidArgument:
			// A bad filter is the viewer's to fix, on the same page.
			d.Problem = status.Convert(err2).Message()
		default:
			return "", frame{}, err2
		}
	}
	return "audit", frame{Title: "Audit log", Nav: "audit", Live: "/events", Data: d}, nil
}

type entryData struct {
	Event      eventView
	Checkpoint *checkpointView
	LeafHash   string
	Proof      []string
	Included   bool
	Problem    string
}

// entryPage shows one entry, verified, with its inclusion proof in the
// latest checkpoint, checked against that checkpoint's root.
func (h *Handler) entryPage(r *http.Request, v *viewer) (string, frame, error) {
	ctx := v.ctx(r)
	i, err := strconv.ParseUint(r.PathValue("index"), 10, 64)
	if err != nil {
		return "", frame{}, errNotFound
	}
	k, err := h.keys(ctx)
	if err != nil {
		return "", frame{}, err
	}
	cp, err := h.checkpoint(ctx, k)
	if err != nil {
		return "", frame{}, err
	}
	key, err := k.entryKey()
	if err != nil {
		return "", frame{}, err
	}
	st, err := h.audit().ExportEntries(ctx, &pb.ExportEntriesRequest{StartIndex: i, EndIndex: i + 1})
	if err != nil {
		return "", frame{}, err
	}
	msg, err := st.Recv()
	if status.Code(err) == codes.OutOfRange {
		return "", frame{}, errNotFound // beyond the log
	}
	if err != nil && err != io.EOF {
		return "", frame{}, err
	}
	if msg == nil || len(msg.GetEntries()) != 1 || msg.GetEntries()[0].GetIndex() != i {
		return "", frame{}, errorf("the server did not send entry %d", i)
	}
	pe := msg.GetEntries()[0]
	ev, err := verified(pe, key)
	if err != nil {
		return "", frame{}, err
	}
	d := entryData{Event: viewOf(i, ev), Checkpoint: cp, LeafHash: hex.EncodeToString(pe.GetLeafHash())}
	switch {
	case !cp.Verified && cp.Pending == "":
		d.Problem = "the latest checkpoint does not verify, so inclusion cannot be checked: " + cp.Problem
		return "entry", frame{Title: "Audit entry " + strconv.FormatUint(i, 10), Nav: "audit", Data: d}, nil
	case i >= cp.Size:
		// Checkpoints are signed every second while the log grows.
		d.Problem = "not in a checkpoint yet (the latest covers " + strconv.FormatUint(cp.Size, 10) + " entries): reload in a moment"
		return "entry", frame{Title: "Audit entry " + strconv.FormatUint(i, 10), Nav: "audit", Data: d}, nil
	}
	p, err := h.audit().GetInclusionProof(ctx, &pb.GetInclusionProofRequest{LeafIndex: i, TreeSize: cp.Size})
	if err != nil {
		return "", frame{}, err
	}
	hashes := p.GetProof().GetHashes()
	for _, x := range hashes {
		d.Proof = append(d.Proof, hex.EncodeToString(x))
	}
	root, _ := hex.DecodeString(cp.Root)
	if err := audit.VerifyInclusion(i, cp.Size, pe.GetLeafHash(), hashes, root); err != nil {
		d.Problem = err.Error()
	} else {
		d.Included = true
	}
	return "entry", frame{Title: "Audit entry " + strconv.FormatUint(i, 10), Nav: "audit", Data: d}, nil
}
