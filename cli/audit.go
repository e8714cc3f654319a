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
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Bounds on the small files audit verify reads.
const (
	maxJWKSFile       = 64 << 10
	maxCheckpointFile = 64 << 10
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
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewAuditServiceClient(conn).GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
				if err != nil {
					return err
				}
				note := res.GetCheckpoint().GetNote()
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
	cmd := &cobra.Command{
		Use:   "export [-o FILE] [--server ADDR | --data-dir DIR]",
		Short: "Write the audit log in its export format, for offline verification",
		Long: "export writes the public keys, checkpoints and entries as JSON lines. From a running server\n" +
			"it takes the latest checkpoint and the entries it covers; with --data-dir it reads a stopped\n" +
			"server's data directory (read-only; copy audit.db together with its -wal file) and writes\n" +
			"every stored entry and checkpoint as they are, for verify to judge.",
		Example: `  fleetlearn audit export -o audit.jsonl
  fleetlearn audit export --data-dir /var/lib/fleetlearn -o audit.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir != "" && cmd.Flag("server").Changed {
				return fmt.Errorf("%w: --server and --data-dir cannot be used together", ErrUsage)
			}
			return writeOutput(cmd, output, func(w io.Writer) error {
				if dataDir != "" {
					return exportDataDir(cmd.Context(), w, dataDir)
				}
				return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
					return exportServer(ctx, w, apiv1.NewAuditServiceClient(conn))
				})
			})
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "file to write; standard output when empty or -")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "read the log of a stopped server from this data directory instead")
	return cmd
}

// writeOutput runs write into a file that appears under its name only once
// complete, or into standard output.
func writeOutput(cmd *cobra.Command, path string, write func(io.Writer) error) error {
	if path == "" || path == "-" {
		return write(cmd.OutOrStdout())
	}
	// 0600: an export lists who did what; sharing it is the operator's
	// decision.
	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer f.Abort()
	if err := write(f); err != nil {
		return err
	}
	if err := f.Commit(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", path)
	return nil
}

func exportDataDir(ctx context.Context, w io.Writer, dir string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	lg, err := audit.OpenReadOnly(ctx, dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	defer lg.Close()
	return lg.Export(ctx, w)
}

// exportServer assembles an export from the API: the keys, the latest
// checkpoint and exactly the entries it covers. Nothing the server sends
// is trusted here; verify checks it all.
func exportServer(ctx context.Context, w io.Writer, c apiv1.AuditServiceClient) error {
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
	cp, err := audit.ParseCheckpoint(res.GetCheckpoint().GetNote(), keys.GetCheckpointVerifierKey())
	if err != nil {
		return fmt.Errorf("%w: server's checkpoint: %w", ErrProtocol, err)
	}
	pub := audit.PublicKeys{Origin: keys.GetOrigin(), Entry: entryKey, EntryKeyID: keys.GetEntryKeyId(),
		VerifierKey: keys.GetCheckpointVerifierKey()}
	x, err := audit.NewExportWriter(w, pub, [][]byte{cp.Note}, cp.Size)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if cp.Size > 0 { // an end_index of 0 would mean the current size
		st, err := c.ExportEntries(ctx, &pb.ExportEntriesRequest{StartIndex: 0, EndIndex: cp.Size})
		if err != nil {
			return err
		}
		for {
			msg, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			for _, pe := range msg.GetEntries() {
				if err := x.WriteEntry(audit.Entry{Index: pe.GetIndex(), Data: pe.GetJws()}, pe.GetLeafHash()); err != nil {
					return fmt.Errorf("%w: %w", ErrProtocol, err)
				}
			}
		}
	}
	if err := x.Close(); err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return nil
}

type auditVerifyFlags struct {
	jwks        string
	verifierKey string
	trusted     []string
	uncovered   bool
}

func newAuditVerifyCommand(_ *app) *cobra.Command {
	var f auditVerifyFlags
	cmd := &cobra.Command{
		Use:   "verify EXPORT [--jwks FILE] [--verifier-key KEY] [--trusted-checkpoint FILE]...",
		Short: "Verify an audit export offline",
		Long: "verify checks an export without trusting the server: every entry's signature, index and\n" +
			"canonical form, the Merkle tree against every checkpoint, the checkpoints' signatures and\n" +
			"growth, and any proofs. Pin the keys published for the log with --jwks and --verifier-key;\n" +
			"without them the export's own keys are used and only reported. --trusted-checkpoint adds a\n" +
			"checkpoint kept earlier (from audit checkpoint or a witness): the export must still hold\n" +
			"that tree. On failure it names the first bad entry and exits non-zero. EXPORT - reads\n" +
			"standard input.",
		Example: `  fleetlearn audit verify audit.jsonl --jwks audit-keys.jwks \
    --verifier-key 'fleetlearn/audit+1a2b3c4d+AbC...' --trusted-checkpoint last-week.checkpoint`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := f.options()
			if err != nil {
				return err
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
	fl.StringVar(&f.jwks, "jwks", "", "file with the published entry key (a JWKS with one Ed25519 key)")
	fl.StringVar(&f.verifierKey, "verifier-key", "", "the published checkpoint verifier key")
	fl.StringArrayVar(&f.trusted, "trusted-checkpoint", nil, "file with a checkpoint note kept earlier; repeatable")
	fl.BoolVar(&f.uncovered, "allow-uncovered", false,
		"accept entries after the latest checkpoint, as a server killed before its next checkpoint leaves them")
	return cmd
}

func (f *auditVerifyFlags) options() ([]audit.VerifyOption, error) {
	var opts []audit.VerifyOption
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
	if f.uncovered {
		opts = append(opts, audit.WithUncoveredTail())
	}
	return opts, nil
}

func readSmallFile(path string, limit int64) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	defer file.Close()
	b, err := io.ReadAll(io.LimitReader(file, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInput, path, limit)
	}
	return b, nil
}

func printReport(w io.Writer, rep audit.Report, f auditVerifyFlags) error {
	tab := newTable(w)
	tab.row("verified:", "export of "+rep.Origin)
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
	if f.uncovered {
		tab.row("uncovered:", fmt.Sprintf("%d entries after the latest checkpoint", rep.Uncovered))
	}
	entryKey, vkey := "from the export: compare with the published key", "from the export: compare with the published key"
	if f.jwks != "" {
		entryKey = "pinned"
	}
	if f.verifierKey != "" {
		vkey = "pinned"
	}
	tab.row("entry key:", rep.EntryKeyID+" ("+entryKey+")")
	tab.row("verifier key:", rep.VerifierKey+" ("+vkey+")")
	types := make([]string, 0, len(rep.Types))
	for t, n := range rep.Types {
		types = append(types, fmt.Sprintf("%s=%d", t, n))
	}
	slices.Sort(types)
	tab.row("events:", orDash(strings.Join(types, " ")))
	return tab.flush()
}
