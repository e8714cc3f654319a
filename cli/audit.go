package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/audit/witness"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/smallfile"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Bounds on the small files audit verify reads.
const (
	maxJWKSFile       = 64 << 10
	maxCheckpointFile = 64 << 10
	maxPinFile        = 64 << 10
)

func newAuditCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Query, export and verify the tamper-evident audit log",
		Long: "The aggregator records what happens to tasks, rounds, models, modules, devices and privacy\n" +
			"budgets in a signed, append-only log. These commands read it through the API or from a\n" +
			"stopped server's data directory, and verify an export offline.",
	}
	cmd.AddCommand(
		newAuditQueryCommand(a),
		newAuditCheckpointCommand(a),
		newAuditExportCommand(a),
		newAuditVerifyCommand(a),
		newAuditKeysCommand(a),
		newAuditWitnessCommand(a),
	)
	return cmd
}

type auditQueryFlags struct {
	filter       string
	task, typ    string
	actor        string
	since, until string
	round        uint64
	json         bool
	limit        int
}

// filterFlags are the flags that --filter replaces.
var filterFlags = []string{"task", "round", "type", "actor", "since", "until"}

func newAuditQueryCommand(a *app) *cobra.Command {
	var f auditQueryFlags
	cmd := &cobra.Command{
		Use:   "query [--filter EXPR | --task ID --round N --type TYPE --actor [KIND:]ID --since T --until T] [--json] [--limit N]",
		Short: "List audit entries matching a filter, oldest first",
		Long: "query pages through every matching entry. Each entry's signature is checked with the key the\n" +
			"server reports and against the filter, so a server whose index disagrees with its entries is\n" +
			"caught; use export and verify to check the log against keys published out of band.\n\n" +
			"Filter expressions are space-separated key=value terms: type, task, round, actor\n" +
			"([operator:|service:|device:]ID), since and until (RFC 3339 or YYYY-MM-DD, UTC; until is exclusive).",
		Example: `  fleetlearn audit query --task t-1 --type round.closed
  fleetlearn audit query --filter 'actor=operator:alice since=2026-01-01' --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.limit < 0 {
				return fmt.Errorf("%w: --limit %d must not be negative", ErrUsage, f.limit)
			}
			filter, err := f.build()
			if err != nil {
				return err
			}
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				return f.run(ctx, cmd.OutOrStdout(), apiv1.NewAuditServiceClient(conn), filter)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.filter, "filter", "", "filter expression, e.g. 'task=t-1 type=round.closed'")
	fl.StringVar(&f.task, "task", "", "only entries about this task")
	fl.Uint64Var(&f.round, "round", 0, "only entries about this round (from 1)")
	fl.StringVar(&f.typ, "type", "", "only entries of this event type, e.g. round.closed")
	fl.StringVar(&f.actor, "actor", "", "only entries by this actor: ID or KIND:ID (operator, service, device)")
	fl.StringVar(&f.since, "since", "", "only entries at or after this time (RFC 3339 or YYYY-MM-DD)")
	fl.StringVar(&f.until, "until", "", "only entries before this time (RFC 3339 or YYYY-MM-DD)")
	fl.BoolVar(&f.json, "json", false, "print one JSON object per line instead of a table")
	fl.IntVar(&f.limit, "limit", 0, "print at most this many entries; 0 prints all")
	for _, n := range filterFlags {
		cmd.MarkFlagsMutuallyExclusive("filter", n)
	}
	return cmd
}

// build turns the flags into a filter. Individual flags are written as an
// expression and parsed, so both forms are checked by the same rules.
func (f *auditQueryFlags) build() (audit.Filter, error) {
	text := f.filter
	if text == "" {
		fl := audit.Filter{Task: f.task, Round: f.round, Type: audit.EventType(f.typ), Actor: f.actor}
		for _, t := range []struct {
			flag, v string
			dst     *time.Time
		}{{"since", f.since, &fl.Since}, {"until", f.until, &fl.Until}} {
			if t.v == "" {
				continue
			}
			v, err := time.Parse(time.RFC3339Nano, t.v)
			if err != nil {
				if v, err = time.Parse(time.DateOnly, t.v); err != nil {
					return audit.Filter{}, fmt.Errorf("%w: --%s %q: want an RFC 3339 time or YYYY-MM-DD", ErrUsage, t.flag, t.v)
				}
			}
			*t.dst = v.UTC()
		}
		text = fl.String()
	}
	filter, err := audit.ParseFilter(text)
	if err != nil {
		return audit.Filter{}, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return filter, nil
}

// filterProto is the API form of a filter.
func filterProto(f audit.Filter) *pb.AuditFilter {
	af := &pb.AuditFilter{TaskId: f.Task, Round: f.Round, EventType: string(f.Type), Actor: f.Actor}
	if f.ActorKind != "" {
		af.Actor = string(f.ActorKind) + ":" + f.Actor
	}
	if !f.Since.IsZero() {
		af.StartTime = timestamppb.New(f.Since)
	}
	if !f.Until.IsZero() {
		af.EndTime = timestamppb.New(f.Until)
	}
	return af
}

func (f *auditQueryFlags) run(ctx context.Context, w io.Writer, c apiv1.AuditServiceClient, filter audit.Filter) error {
	keys, err := c.GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
	if err != nil {
		return err
	}
	entryKey, err := audit.ParseJWKS(keys.GetEntryJwks())
	if err != nil {
		return fmt.Errorf("%w: server's entry key: %w", ErrProtocol, err)
	}
	var tab *table
	if !f.json {
		tab = newTable(w, "INDEX", "TIME", "TYPE", "ACTOR", "TASK", "ROUND", "PAYLOAD")
	}
	req := &pb.QueryEntriesRequest{Filter: filterProto(filter)}
	printed := 0
	for {
		req.PageSize = audit.MaxPageSize
		if f.limit > 0 {
			req.PageSize = int32(min(f.limit-printed, audit.MaxPageSize))
		}
		res, err := c.QueryEntries(ctx, req)
		if err != nil {
			return err
		}
		for _, pe := range res.GetEntries() {
			if f.limit > 0 && printed == f.limit {
				break
			}
			ev, err := checkQueried(pe, entryKey, filter)
			if err != nil {
				return err
			}
			if f.json {
				err = writeEntryJSON(w, pe, ev)
			} else {
				tab.row(entryRow(pe.GetIndex(), ev)...)
			}
			if err != nil {
				return err
			}
			printed++
		}
		next := res.GetNextPageToken()
		if next == "" || f.limit > 0 && printed >= f.limit {
			break
		}
		if next == req.GetPageToken() {
			return fmt.Errorf("%w: query page token %q repeats", ErrProtocol, next)
		}
		req.PageToken = next
	}
	if tab != nil {
		return tab.flush()
	}
	return nil
}

// checkQueried verifies a returned entry against the server's key and the
// filter: the entry's bytes, not the server's index, are authoritative.
func checkQueried(pe *pb.AuditEntry, key []byte, filter audit.Filter) (audit.Event, error) {
	e := audit.Entry{Index: pe.GetIndex(), Data: pe.GetJws()}
	ev, err := audit.VerifyEntry(e, key)
	if err != nil {
		return audit.Event{}, fmt.Errorf("%w: entry %d: %w", ErrProtocol, e.Index, err)
	}
	if h := e.LeafHash(); !bytes.Equal(pe.GetLeafHash(), h[:]) {
		return audit.Event{}, fmt.Errorf("%w: entry %d: leaf hash does not match its bytes", ErrProtocol, e.Index)
	}
	if !filter.Match(ev) {
		return audit.Event{}, fmt.Errorf("%w: entry %d does not match the filter", ErrProtocol, e.Index)
	}
	return ev, nil
}

func writeEntryJSON(w io.Writer, pe *pb.AuditEntry, ev audit.Event) error {
	event, err := ev.MarshalCanonical()
	if err != nil {
		return err
	}
	b, err := json.Marshal(struct {
		Index    uint64          `json:"index"`
		LeafHash string          `json:"leaf_hash"`
		Event    json.RawMessage `json:"event"`
	}{pe.GetIndex(), hex.EncodeToString(pe.GetLeafHash()), event})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// maxPayloadCell shortens the payload column; --json has it in full.
const maxPayloadCell = 80

func entryRow(index uint64, ev audit.Event) []string {
	round := "-"
	if ev.Subject.Round != 0 {
		round = fmt.Sprint(ev.Subject.Round)
	}
	payload := string(ev.Payload)
	if len(payload) > maxPayloadCell {
		cut := maxPayloadCell
		for cut > 0 && !utf8.RuneStart(payload[cut]) {
			cut--
		}
		payload = payload[:cut] + "…"
	}
	return []string{fmt.Sprint(index), ev.Time.UTC().Format("2006-01-02T15:04:05.000Z"), string(ev.Type),
		ev.Actor.String(), orDash(ev.Subject.Task), round, payload}
}

func newAuditCheckpointCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "checkpoint",
		Short: "Print the latest signed checkpoint note",
		Long: "checkpoint prints the log's latest checkpoint, a C2SP signed note committing to the tree\n" +
			"size and root hash. Keep it: audit verify --trusted-checkpoint proves that a later export\n" +
			"still contains the same history.",
		Example: "  fleetlearn audit checkpoint > checkpoint-2026-06.note\n" +
			"  fleetlearn audit verify audit.jsonl --pin audit.pin --trusted-checkpoint checkpoint-2026-06.note",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewAuditServiceClient(conn).GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
				if err != nil {
					return err
				}
				// With the witnesses' cosignatures, which every signed-note
				// reader skips unless it knows the witness.
				note := res.GetCheckpoint().GetCosignedNote()
				if len(note) == 0 {
					note = res.GetCheckpoint().GetNote()
				}
				if len(note) == 0 {
					return fmt.Errorf("%w: empty checkpoint", ErrProtocol)
				}
				_, err = cmd.OutOrStdout().Write(note)
				return err
			})
		},
	}
}

func newAuditExportCommand(a *app) *cobra.Command {
	var output, dataDir string
	var proofs bool
	cmd := &cobra.Command{
		Use:   "export [-o FILE] [--server ADDR | --data-dir DIR] [--proofs]",
		Short: "Write the audit log in its export format, for offline verification",
		Long: "export writes the public keys, checkpoints and entries as JSON lines. From a running server\n" +
			"it takes the latest checkpoint (with the witnesses' cosignatures) and the entries it covers;\n" +
			"with --data-dir it reads a stopped server's data directory (read-only; copy audit.db together\n" +
			"with its -wal file) and writes every stored entry and checkpoint as they are, for verify to\n" +
			"judge. --proofs adds RFC 9162 proofs that a verifier written from the RFC alone can check:\n" +
			"each entry's inclusion in the tree of the latest checkpoint, and each checkpoint's\n" +
			"consistency with the one before it (docs/AUDIT.md, \"Verifying without Fleetlearn's code\").",
		Example: `  fleetlearn audit export -o audit.jsonl
  fleetlearn audit export --data-dir /var/lib/fleetlearn --proofs -o audit.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir != "" && cmd.Flag("server").Changed {
				return fmt.Errorf("%w: --server and --data-dir cannot be used together", ErrUsage)
			}
			return writeOutput(cmd, output, func(w io.Writer) error {
				if dataDir != "" {
					return exportDataDir(cmd.Context(), w, dataDir, proofs)
				}
				return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
					return exportServer(ctx, w, apiv1.NewAuditServiceClient(conn), proofs)
				})
			})
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "file to write; standard output when empty or -")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "read the log of a stopped server from this data directory instead")
	cmd.Flags().BoolVar(&proofs, "proofs", false, "add an inclusion proof to every entry and a consistency proof to every checkpoint")
	return cmd
}

// writeOutput writes an export: 0600, since it lists who did what and
// sharing it is the operator's decision.
func writeOutput(cmd *cobra.Command, path string, write func(io.Writer) error) error {
	return writeFile(cmd, path, 0o600, write)
}

// writeFile runs write into a file that appears under its name only once
// complete, or into standard output.
func writeFile(cmd *cobra.Command, path string, mode os.FileMode, write func(io.Writer) error) error {
	if path == "" || path == "-" {
		return write(cmd.OutOrStdout())
	}
	f, err := atomicfile.Create(path, mode)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	defer f.Abort()
	if err := write(f); err != nil {
		return err
	}
	if err := f.Commit(); err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", path)
	return nil
}

func exportDataDir(ctx context.Context, w io.Writer, dir string, proofs bool) error {
	if ctx == nil {
		ctx = context.Background()
	}
	lg, err := audit.OpenReadOnly(ctx, dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	defer lg.Close()
	var opts []audit.ExportOption
	if proofs {
		opts = append(opts, audit.WithProofs())
	}
	return lg.Export(ctx, w, opts...)
}

// exportServer assembles an export from the API: the keys, the latest
// checkpoint and exactly the entries it covers. Nothing the server sends
// is trusted here; verify checks it all. With proofs the entries are read
// twice: once for their leaf hashes, once to write them with their proofs.
func exportServer(ctx context.Context, w io.Writer, c apiv1.AuditServiceClient, proofs bool) error {
	keys, err := c.GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
	if err != nil {
		return err
	}
	entryKey, err := audit.ParseJWKS(keys.GetEntryJwks())
	if err != nil {
		return fmt.Errorf("%w: server's entry key: %w", ErrProtocol, err)
	}
	res, err := c.GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
	if err != nil {
		return err
	}
	// The cosigned note is the log's note with the witnesses' lines added;
	// a server from before witnesses sends only the note.
	msg := res.GetCheckpoint().GetCosignedNote()
	if len(msg) == 0 {
		msg = res.GetCheckpoint().GetNote()
	}
	cp, err := audit.ParseCheckpoint(msg, keys.GetCheckpointVerifierKey())
	if err != nil {
		return fmt.Errorf("%w: server's checkpoint: %w", ErrProtocol, err)
	}
	pub := audit.PublicKeys{Origin: keys.GetOrigin(), Entry: entryKey, EntryKeyID: keys.GetEntryKeyId(),
		VerifierKey: keys.GetCheckpointVerifierKey()}
	var opts []audit.WriterOption
	if proofs {
		leaves := make([][32]byte, 0, min(cp.Size, 1<<20))
		err := streamEntries(ctx, c, cp.Size, func(pe *pb.AuditEntry) error {
			if uint64(len(leaves)) != pe.GetIndex() {
				return fmt.Errorf("%w: entry %d where %d belongs", ErrProtocol, pe.GetIndex(), len(leaves))
			}
			leaves = append(leaves, audit.LeafHash(pe.GetJws()))
			return nil
		})
		if err != nil {
			return err
		}
		opts = append(opts, audit.WithLeafHashes(leaves))
	}
	x, err := audit.NewExportWriter(w, pub, [][]byte{cp.Note}, cp.Size, opts...)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	err = streamEntries(ctx, c, cp.Size, func(pe *pb.AuditEntry) error {
		if err := x.WriteEntry(audit.Entry{Index: pe.GetIndex(), Data: pe.GetJws()}, pe.GetLeafHash()); err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := x.Close(); err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return nil
}

// streamEntries calls f for each of the first n entries the server sends.
func streamEntries(ctx context.Context, c apiv1.AuditServiceClient, n uint64, f func(*pb.AuditEntry) error) error {
	if n == 0 { // an end_index of 0 would mean the current size
		return nil
	}
	st, err := c.ExportEntries(ctx, &pb.ExportEntriesRequest{StartIndex: 0, EndIndex: n})
	if err != nil {
		return err
	}
	for {
		msg, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, pe := range msg.GetEntries() {
			if err := f(pe); err != nil {
				return err
			}
		}
	}
}

type auditVerifyFlags struct {
	jwks          string
	verifierKey   string
	pin           string
	dataDir       string
	trusted       []string
	witnesses     []string
	witnessCPs    []string
	witnessOff    bool
	witnessMaxAge time.Duration
	uncovered     bool
}

// defaultWitnessMaxAge is how old a witness's own checkpoint (or, with
// --witness-offline, the cosignature in the export) may be by default:
// witnesses re-cosign every few seconds, so an hour of silence means a
// witness that stopped, which it does when it finds the log inconsistent.
const defaultWitnessMaxAge = time.Hour

func newAuditVerifyCommand(_ *app) *cobra.Command {
	var f auditVerifyFlags
	cmd := &cobra.Command{
		Use:   "verify (EXPORT | --data-dir DIR) [--pin FILE | --jwks FILE --verifier-key KEY] [--witness KEY]... [--witness-checkpoint FILE|DIR]... [--witness-offline] [--trusted-checkpoint FILE]...",
		Short: "Verify an audit export, or a server's data directory, offline",
		Long: "verify checks the log without trusting the server: every entry's signature, index and\n" +
			"canonical form, the Merkle tree against every checkpoint, the checkpoints' signatures and\n" +
			"growth, any proofs, and that every committed round has all its events. Pin the log's keys\n" +
			"with --pin (a file from audit keys, checked with the operator over a second channel) or\n" +
			"--jwks and --verifier-key; without them the export's own keys are used and only reported.\n" +
			"--witness (or a pin naming witnesses) requires the latest checkpoint to carry that witness's\n" +
			"cosignature, and the log to contain the newest checkpoint the witness itself cosigned:\n" +
			"--witness-checkpoint, the file 'cosigned' in the witness's --state folder (or the folder),\n" +
			"fetched before the export and at most --witness-max-age old. A log rolled back, truncated\n" +
			"or forked since the witness saw it fails. --witness-offline does without it and checks only\n" +
			"the age of the cosignature in the export, which a log rolled back to a checkpoint cosigned\n" +
			"within --witness-max-age passes. --trusted-checkpoint adds a checkpoint kept earlier.\n" +
			"--data-dir verifies a stopped server's directory in place and checks the query index too,\n" +
			"which an export does not carry. On failure it names the first bad entry and exits\n" +
			"non-zero. EXPORT - reads standard input.",
		Example: `  fleetlearn audit keys > audit.pin        # once; compare the fingerprints with the operator
  fleetlearn audit verify audit.jsonl --pin audit.pin --witness 'witness.example.org+5b1d0c2e+BMw...' \
    --witness-checkpoint witness-cosigned.note   # the witness's state/cosigned, fetched before the export
  fleetlearn audit verify --data-dir /var/lib/fleetlearn --pin audit.pin`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case f.dataDir != "" && len(args) > 0:
				return fmt.Errorf("%w: give an EXPORT file or --data-dir, not both", ErrUsage)
			case f.dataDir == "" && len(args) != 1:
				return fmt.Errorf("%w: verify needs an EXPORT file (from audit export) or --data-dir DIR", ErrUsage)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := f.options()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			if f.dataDir != "" {
				rep, err := audit.VerifyDataDir(ctx, f.dataDir, opts...)
				var ve *audit.VerifyError
				if errors.As(err, &ve) {
					return fmt.Errorf("the audit log in %s does not verify: %w", f.dataDir, err)
				}
				if err != nil { // not a verdict: the log could not be read
					return fmt.Errorf("%w: %w", ErrInput, err)
				}
				return printReport(cmd.OutOrStdout(), rep, f)
			}
			in, name := cmd.InOrStdin(), "standard input"
			if args[0] != "-" {
				file, err := os.Open(args[0])
				if err != nil {
					return fmt.Errorf("%w: %w", ErrInput, err)
				}
				defer file.Close()
				in, name = file, args[0]
			}
			rep, err := audit.VerifyExport(in, opts...)
			if err != nil {
				return fmt.Errorf("%s does not verify: %w", name, err)
			}
			return printReport(cmd.OutOrStdout(), rep, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.pin, "pin", "", "file with the log's public keys and witnesses, as audit keys prints them")
	fl.StringVar(&f.jwks, "jwks", "", "file with the published entry key (a JWKS with one Ed25519 key)")
	fl.StringVar(&f.verifierKey, "verifier-key", "", "the published checkpoint verifier key")
	fl.StringVar(&f.dataDir, "data-dir", "", "verify a stopped server's data directory (read-only) instead of an export")
	fl.StringArrayVar(&f.witnesses, "witness", nil, "verifier key of a witness whose cosignature the latest checkpoint must carry; repeatable")
	fl.StringArrayVar(&f.witnessCPs, "witness-checkpoint", nil,
		"the newest checkpoint a witness cosigned, from the witness itself: the file cosigned in its --state folder, or the folder;\n"+
			"fetch it before the export; repeatable, one per witness")
	fl.BoolVar(&f.witnessOff, "witness-offline", false,
		"check the witnesses' cosignatures in the export without their own checkpoints: only their age, so a log rolled back\n"+
			"to a checkpoint cosigned within --witness-max-age passes")
	fl.DurationVar(&f.witnessMaxAge, "witness-max-age", defaultWitnessMaxAge,
		"oldest witness checkpoint accepted (with --witness-offline: oldest cosignature in the export); 0: any age")
	fl.StringArrayVar(&f.trusted, "trusted-checkpoint", nil, "file with a checkpoint note kept earlier; repeatable")
	fl.BoolVar(&f.uncovered, "allow-uncovered", false,
		"accept entries after the latest checkpoint, as a server killed before its next checkpoint leaves them;\n"+
			"nothing signed vouches for those, so their removal or change cannot be detected")
	return cmd
}

func (f *auditVerifyFlags) options() ([]audit.VerifyOption, error) {
	var opts []audit.VerifyOption
	if f.pin != "" {
		if f.jwks != "" || f.verifierKey != "" {
			return nil, fmt.Errorf("%w: --pin already names the keys; drop --jwks and --verifier-key", ErrUsage)
		}
		b, err := readSmallFile(f.pin, maxPinFile)
		if err != nil {
			return nil, err
		}
		p, err := audit.ParsePin(b)
		if err != nil {
			return nil, fmt.Errorf("%w: --pin %s: %w", ErrInput, f.pin, err)
		}
		opts = append(opts, audit.WithPin(p))
		f.witnesses = append(f.witnesses, p.Witnesses...)
	}
	if f.jwks != "" {
		b, err := readSmallFile(f.jwks, maxJWKSFile)
		if err != nil {
			return nil, err
		}
		key, err := audit.ParseJWKS(b)
		if err != nil {
			return nil, fmt.Errorf("%w: --jwks %s: %w", ErrInput, f.jwks, err)
		}
		opts = append(opts, audit.WithEntryKey(key))
	}
	if f.verifierKey != "" {
		// Checked here so that a typo is reported as such, not as a
		// key mismatch.
		if _, err := audit.ParseCheckpoint(nil, f.verifierKey); errors.Is(err, audit.ErrInvalidKeys) {
			return nil, fmt.Errorf("%w: --verifier-key: %w", ErrUsage, err)
		}
		opts = append(opts, audit.WithVerifierKey(f.verifierKey))
	}
	for _, path := range f.trusted {
		b, err := readSmallFile(path, maxCheckpointFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, audit.WithTrustedCheckpoint(b))
	}
	for _, w := range f.witnesses {
		if err := audit.CheckWitnessKey(w); err != nil {
			return nil, fmt.Errorf("%w: --witness %q: %w", ErrUsage, w, err)
		}
		opts = append(opts, audit.WithWitness(w))
	}
	if f.witnessMaxAge < 0 {
		return nil, fmt.Errorf("%w: --witness-max-age %s is negative", ErrUsage, f.witnessMaxAge)
	}
	opts = append(opts, audit.WithWitnessMaxAge(f.witnessMaxAge, time.Now))
	views, err := f.witnessOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, views...)
	if f.uncovered {
		opts = append(opts, audit.WithUncoveredTail())
	}
	return opts, nil
}

// witnessOptions reads the witnesses' own checkpoints, which every
// required witness needs unless --witness-offline says to do without.
func (f *auditVerifyFlags) witnessOptions() ([]audit.VerifyOption, error) {
	switch {
	case len(f.witnesses) == 0 && (len(f.witnessCPs) > 0 || f.witnessOff):
		return nil, fmt.Errorf("%w: --witness-checkpoint and --witness-offline need the witness: name it with --witness KEY or a --pin file listing it", ErrUsage)
	case len(f.witnesses) == 0:
		return nil, nil
	case f.witnessOff && len(f.witnessCPs) > 0:
		return nil, fmt.Errorf("%w: --witness-offline does without --witness-checkpoint; give one or the other", ErrUsage)
	case f.witnessOff:
		return []audit.VerifyOption{audit.WithWitnessOffline()}, nil
	case len(f.witnessCPs) == 0:
		return nil, fmt.Errorf("%w: the witness's cosignature in the log alone does not show the log was not rolled back: a restored copy keeps the "+
			"cosignatures of its own time. Give the newest checkpoint the witness itself cosigned with --witness-checkpoint (the file %s in its "+
			"--state folder, or the folder; ask the witness's operator for it), fetched before the export; or pass --witness-offline to check only "+
			"the cosignature's age, which a rollback within --witness-max-age (%s) passes", ErrUsage, witness.CosignedFile, f.witnessMaxAge)
	}
	var opts []audit.VerifyOption
	for _, path := range f.witnessCPs {
		var b []byte
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			b, err = witness.ReadCosigned(path)
			if errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("%w: --witness-checkpoint %s: the witness has cosigned nothing yet (no %s); run it first: %w", ErrInput, path, witness.CosignedFile, err)
			}
			if err != nil {
				return nil, fmt.Errorf("%w: --witness-checkpoint: %w", ErrInput, err)
			}
		} else if b, err = readSmallFile(path, maxCheckpointFile); err != nil {
			return nil, err
		}
		opts = append(opts, audit.WithWitnessCheckpoint(b))
	}
	return opts, nil
}

func readSmallFile(path string, limit int64) ([]byte, error) {
	b, err := smallfile.Read(path, limit)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	return b, nil
}

func printReport(w io.Writer, rep audit.Report, f auditVerifyFlags) error {
	tab := newTable(w)
	what := "export of " + rep.Origin
	if f.dataDir != "" {
		what = "data directory " + f.dataDir + " (" + rep.Origin + ")"
	}
	tab.row("verified:", what)
	times := "-"
	if rep.Entries > 0 {
		times = rep.First.UTC().Format(time.RFC3339) + " to " + rep.Last.UTC().Format(time.RFC3339)
	}
	tab.row("entries:", fmt.Sprintf("%d, %s", rep.Entries, times))
	tab.row("tree:", fmt.Sprintf("size %d, root %s", rep.Entries, base64.StdEncoding.EncodeToString(rep.Root[:])))
	tab.row("checkpoints:", fmt.Sprintf("%d checked, latest at size %d", rep.Checkpoints, rep.Checkpoint.Size))
	if len(f.trusted) > 0 {
		tab.row("trusted:", fmt.Sprintf("%d checkpoints matched", rep.Trusted))
	}
	tab.row("proofs:", fmt.Sprintf("%d checked", rep.Proofs))
	for _, c := range rep.Witnessed {
		seen := "offline: not held to the witness's own newest checkpoint, so a rollback to a checkpoint it cosigned within --witness-max-age would pass"
		if !f.witnessOff {
			seen = fmt.Sprintf("contains the witness's own newest checkpoint, size %d cosigned at %s", c.OwnSize, c.OwnTime.UTC().Format(time.RFC3339))
		}
		tab.row("witness:", fmt.Sprintf("%s cosigned size %d at %s; %s", c.Witness, c.Size, c.Time.UTC().Format(time.RFC3339), seen))
	}
	if len(rep.Witnessed) == 0 {
		tab.row("witness:", "none required: a rollback to an earlier checkpoint would pass (use --witness or --trusted-checkpoint)")
	}
	if f.uncovered {
		tab.row("uncovered:", fmt.Sprintf("%d entries after the latest checkpoint", rep.Uncovered))
	}
	from := "from the export: compare with the published key"
	if f.dataDir != "" {
		from = "from the log: compare with the published key"
	}
	entryKey, vkey := from, from
	if f.jwks != "" || f.pin != "" {
		entryKey = "pinned"
	}
	if f.verifierKey != "" || f.pin != "" {
		vkey = "pinned"
	}
	tab.row("entry key:", rep.EntryKeyID+" ("+entryKey+")")
	tab.row("verifier key:", rep.VerifierKey+" ("+vkey+")")
	index := "not in an export; verify the server's data directory with --data-dir to check it"
	if rep.IndexChecked {
		index = "every row matches its signed entry"
	}
	tab.row("query index:", index)
	tab.row("rounds:", roundSummary(rep))
	types := make([]string, 0, len(rep.Types))
	for t, n := range rep.Types {
		types = append(types, fmt.Sprintf("%s=%d", t, n))
	}
	slices.Sort(types)
	tab.row("events:", orDash(strings.Join(types, " ")))
	if err := tab.flush(); err != nil {
		return err
	}
	if rep.Uncovered > 0 {
		fmt.Fprintf(w, "WARNING: %d entries from %d on are after the latest checkpoint: nothing signed vouches for them, so entries\n"+
			"removed from or changed in that tail cannot be detected. Restart the server (it signs a checkpoint on start)\n"+
			"and export again to have them covered.\n", rep.Uncovered, rep.Checkpoint.Size)
	}
	return nil
}

// roundSummary says how many committed rounds the completeness check
// covered, per task.
func roundSummary(rep audit.Report) string {
	per := map[string]int{}
	var tasks []string
	for _, r := range rep.Rounds {
		if per[r.Task] == 0 {
			tasks = append(tasks, r.Task)
		}
		per[r.Task]++
	}
	parts := []string{fmt.Sprintf("%d committed, each with all its events", len(rep.Rounds))}
	for _, t := range tasks {
		parts = append(parts, fmt.Sprintf("%s: %d", t, per[t]))
	}
	if n := len(rep.UncheckedTasks); n > 0 {
		parts = append(parts, fmt.Sprintf("not checked (created before this log began): %s", strings.Join(rep.UncheckedTasks, " ")))
	}
	return strings.Join(parts, "; ")
}
