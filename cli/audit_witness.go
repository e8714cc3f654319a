package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/audit"
	"github.com/fleetlearn/fleetlearn/audit/witness"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// maxWitnessKeyFile bounds the key file audit witness reads.
const maxWitnessKeyFile = 4096

// DefaultWitnessInterval is how often audit witness polls the log.
const DefaultWitnessInterval = 10 * time.Second

type witnessFlags struct {
	key, state, logKey string
	interval           time.Duration
	once               bool
}

func newAuditWitnessCommand(a *app) *cobra.Command {
	var f witnessFlags
	cmd := &cobra.Command{
		Use:   "witness --key FILE --state DIR [--log-key VKEY] [--interval 10s] [--once]",
		Short: "Witness the audit log: check each checkpoint extends the last one, and cosign it",
		Long: "witness follows the server's audit checkpoints. Each poll it fetches the latest checkpoint,\n" +
			"checks that it is consistent with the last one this witness cosigned (same root at the same\n" +
			"size, a valid consistency proof for a larger tree), records it in --state, cosigns it\n" +
			"(c2sp.org/tlog-cosignature) and hands the cosignature to the server, which serves it with\n" +
			"the checkpoint to auditors. An unchanged checkpoint is cosigned again, so that a recent\n" +
			"cosignature shows the log is live. The server must list the witness (fleetlearn-server\n" +
			"--audit-witness); reading checkpoints needs a token of the operator or auditor role.\n\n" +
			"The newest cosigned checkpoint stays in --state as the file cosigned: auditors pass it to\n" +
			"'fleetlearn audit verify --witness-checkpoint', which fails a log that holds less.\n\n" +
			"A checkpoint that rolls back, forks or fails its proof is not cosigned: the command writes\n" +
			"both checkpoints to an evidence file in --state, prints an alarm and exits non-zero.\n\n" +
			"The log's verifier key is pinned in --state on first use; pass --log-key with the key\n" +
			"published for the log rather than trusting the server's on first use. Run one witness per\n" +
			"--state; it runs until interrupted, or for one poll with --once. Create the key with\n" +
			"'fleetlearn audit witness init'.",
		Example: `  fleetlearn audit witness init --key witness.key --name witness.example.com/w1
  fleetlearn audit witness --key witness.key --state witness-state --token-file auditor.token \
    --log-key 'fleetlearn/audit+1a2b3c4d+AbC...'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.interval <= 0 {
				return fmt.Errorf("%w: --interval must be positive", ErrUsage)
			}
			return a.runWitness(cmd, f, clock.Real())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.key, "key", "", "the witness's key file, from audit witness init (required)")
	fl.StringVar(&f.state, "state", "", "folder for the witness's state and evidence (required)")
	fl.StringVar(&f.logKey, "log-key", "", "the log's published checkpoint verifier key; default: pinned in --state, or the server's on first use")
	fl.DurationVar(&f.interval, "interval", DefaultWitnessInterval, "time between polls")
	fl.BoolVar(&f.once, "once", false, "poll once and exit")
	for _, n := range []string{"key", "state"} {
		cmd.MarkFlagRequired(n)
	}
	cmd.AddCommand(newAuditWitnessInitCommand())
	return cmd
}

func newAuditWitnessInitCommand() *cobra.Command {
	var key, name string
	cmd := &cobra.Command{
		Use:   "init --key FILE --name NAME",
		Short: "Create a witness key and print its verifier key",
		Long: "init writes a new witness key to --key (mode 0600; it never replaces a file) and prints the\n" +
			"witness's verifier key on standard output. Give that key to the log's operator\n" +
			"(fleetlearn-server --audit-witness) and to the auditors who rely on the witness. The name\n" +
			"should be a schema-less URL naming the witness, such as witness.example.com/w1.",
		Example: "  fleetlearn audit witness init --key witness.key --name witness.example.com/w1 > witness.vkey",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, err := audit.GenerateWitnessKey(rand.Reader, name)
			if err != nil {
				return fmt.Errorf("%w: --name %q: %w", ErrUsage, name, err)
			}
			text, err := k.MarshalText()
			if err != nil {
				return err
			}
			if err := atomicfile.WriteNew(key, text, 0o600); err != nil {
				if errors.Is(err, fs.ErrExist) {
					return fmt.Errorf("%w: %s exists; a witness key is never replaced", ErrUsage, key)
				}
				return fmt.Errorf("witness init: %w", err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote witness key %s; its verifier key, for fleetlearn-server --audit-witness and auditors:\n", key)
			_, err = fmt.Fprintln(cmd.OutOrStdout(), k.VerifierKey())
			return err
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "file to write the key to (required)")
	cmd.Flags().StringVar(&name, "name", "", "the witness's name, e.g. witness.example.com/w1 (required)")
	for _, n := range []string{"key", "name"} {
		cmd.MarkFlagRequired(n)
	}
	return cmd
}

// runWitness sets the witness up and polls: each poll is one call of the
// app (its own connection and --timeout deadline), the waits between them
// are on clk.
func (a *app) runWitness(cmd *cobra.Command, f witnessFlags, clk clock.Clock) error {
	b, err := readSmallFile(f.key, maxWitnessKeyFile)
	if err != nil {
		return err
	}
	key, err := audit.ParseWitnessKey(b)
	if err != nil {
		return fmt.Errorf("%w: --key %s: %w", ErrInput, f.key, err)
	}
	logKey, err := a.witnessLogKey(cmd, f)
	if err != nil {
		return err
	}
	w, err := witness.New(key, logKey, f.state, witness.WithClock(clk))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	defer w.Close()
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	poll := func(context.Context) error {
		return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
			return witnessPoll(ctx, out, apiv1.NewAuditServiceClient(conn), w)
		})
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	return witnessLoop(ctx, clk, f.interval, f.once, errOut, poll)
}

// witnessLogKey is --log-key, else the key pinned in the state, else the
// server's (pinned by witness.New on first use).
func (a *app) witnessLogKey(cmd *cobra.Command, f witnessFlags) (string, error) {
	pinned, err := witness.PinnedLogKey(f.state)
	if err != nil {
		return "", fmt.Errorf("%w: --state %s: %w", ErrInput, f.state, err)
	}
	switch {
	case f.logKey != "":
		if _, err := audit.ParseCheckpoint(nil, f.logKey); errors.Is(err, audit.ErrInvalidKeys) {
			return "", fmt.Errorf("%w: --log-key: %w", ErrUsage, err)
		}
		if pinned != "" && pinned != f.logKey {
			return "", fmt.Errorf("%w: --state %s follows the log with key %s, not --log-key %s", ErrUsage, f.state, pinned, f.logKey)
		}
		return f.logKey, nil
	case pinned != "":
		return pinned, nil
	}
	var key string
	err = a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
		res, err := apiv1.NewAuditServiceClient(conn).GetPublicKeys(ctx, &pb.GetPublicKeysRequest{})
		if err != nil {
			return err
		}
		key = res.GetCheckpointVerifierKey()
		if _, err := audit.ParseCheckpoint(nil, key); errors.Is(err, audit.ErrInvalidKeys) {
			return fmt.Errorf("%w: server's checkpoint verifier key: %w", ErrProtocol, err)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "witness: pinning the log's verifier key as the server reports it (first use; compare it with the published one):\n  %s\n", key)
	return key, nil
}

// witnessLoop polls until ctx ends, waiting interval on clk between polls.
// A poll that fails for want of the server is reported and retried; a
// conflict ends the loop with an alarm. With once it polls a single time
// and returns its error.
func witnessLoop(ctx context.Context, clk clock.Clock, interval time.Duration, once bool, errOut io.Writer, poll func(context.Context) error) error {
	for {
		err := poll(ctx)
		var conflict *witness.ConflictError
		switch {
		case errors.As(err, &conflict):
			printAlarm(errOut, conflict)
			return err
		case err != nil && once:
			return err
		case err != nil && ctx.Err() != nil:
			return nil // interrupted mid-poll
		case err != nil:
			fmt.Fprintf(errOut, "witness: %v (next poll in %s)\n", err, interval)
		case once:
			return nil
		}
		if !clock.Sleep(clk, interval, ctx.Done()) {
			return nil
		}
	}
}

// witnessPoll fetches the latest checkpoint (and a consistency proof when
// the log grew), has the witness check and cosign it, and hands the
// cosignature in.
func witnessPoll(ctx context.Context, out io.Writer, c apiv1.AuditServiceClient, w *witness.Witness) error {
	res, err := c.GetCheckpoint(ctx, &pb.GetCheckpointRequest{})
	if err != nil {
		return err
	}
	note := res.GetCheckpoint().GetNote()
	if len(note) == 0 {
		return fmt.Errorf("%w: empty checkpoint", ErrProtocol)
	}
	prove := func(ctx context.Context, size1, size2 uint64) ([][]byte, error) {
		res, err := c.GetConsistencyProof(ctx, &pb.GetConsistencyProofRequest{First: size1, Second: size2})
		if err != nil {
			return nil, err
		}
		if p := res.GetProof(); p.GetFirst() != size1 || p.GetSecond() != size2 {
			return nil, fmt.Errorf("%w: asked for the consistency proof from %d to %d, got %d to %d",
				ErrProtocol, size1, size2, p.GetFirst(), p.GetSecond())
		}
		return res.GetProof().GetHashes(), nil
	}
	cosigned, err := w.Update(ctx, note, prove)
	if err != nil {
		return err
	}
	added, err := c.AddCosignature(ctx, &pb.AddCosignatureRequest{Note: cosigned})
	if err != nil {
		return err
	}
	last, _ := w.Last()
	_, err = fmt.Fprintf(out, "cosigned %s at size %d, root %s, time %s\n", last.Origin, added.GetTreeSize(),
		base64.StdEncoding.EncodeToString(last.Root[:]), added.GetTime().AsTime().UTC().Format(time.RFC3339))
	return err
}

// printAlarm says loudly what a conflict means and where its evidence is.
func printAlarm(w io.Writer, c *witness.ConflictError) {
	root := func(cp audit.Checkpoint) string { return base64.StdEncoding.EncodeToString(cp.Root[:]) }
	evidence := c.Evidence
	if evidence == "" {
		evidence = "NOT WRITTEN: " + fmt.Sprint(c.Err)
	}
	fmt.Fprintf(w, "\n"+
		"!!! AUDIT LOG INCONSISTENT: %s !!!\n"+
		"The server offered a checkpoint that contradicts the one this witness cosigned:\n"+
		"  cosigned before: %s at size %d, root %s\n"+
		"  offered now:     %s at size %d, root %s\n"+
		"  evidence:        %s\n"+
		"Both checkpoints are signed with the log's key: together they show the log was rolled back\n"+
		"or shows different histories to different readers. The witness did not cosign it and never\n"+
		"will cosign a checkpoint inconsistent with size %d. Keep the evidence file.\n\n",
		c.Reason, c.Last.Origin, c.Last.Size, root(c.Last), c.Offered.Origin, c.Offered.Size, root(c.Offered),
		evidence, c.Last.Size)
}
