package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/proto/wire"
)

// Environment variables the nats CLI reads too, so that one setting serves
// both tools.
const (
	NATSURLEnv   = "NATS_URL"
	NATSCredsEnv = "NATS_CREDS"
)

// natsRoles are the roles of `nats creds --role`, as the CLI spells them.
var natsRoles = map[string]pb.NATSRole{
	string(identity.NATSObserver): pb.NATSRole_NATS_ROLE_OBSERVER,
	string(identity.NATSOperator): pb.NATSRole_NATS_ROLE_OPERATOR,
	string(identity.NATSSystem):   pb.NATSRole_NATS_ROLE_SYSTEM,
}

func newNATSCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nats",
		Short: "Look inside the server's NATS with the nats CLI or as JSON",
		Long: "The aggregator's NATS requires credentials. `nats creds` gets a creds file for the official\n" +
			"nats CLI (github.com/nats-io/natscli); `nats sub` prints the Fleetlearn messages on a subject\n" +
			"as JSON, one per line:\n\n" +
			"  fleetlearn nats creds --role observer -o observer.creds\n" +
			"  nats --server tls://HOST:4222 --creds observer.creds --tlsca ca.crt stream ls\n" +
			"  fleetlearn nats sub 'fl.announce' --creds observer.creds --nats-url tls://HOST:4222 --ca ca.crt",
	}
	cmd.AddCommand(newNATSCredsCommand(a), newNATSSubCommand(a))
	return cmd
}

func newNATSCredsCommand(a *app) *cobra.Command {
	var role, out, name string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "creds --role observer|operator|system -o FILE [--ttl 24h] [--name NAME]",
		Short: "Write a NATS creds file for the nats CLI (admin only)",
		Long: "creds makes a NATS user key here, has the server sign a user JWT for its public key in the\n" +
			"role asked for, and writes both to FILE (mode 0600): the key's seed never leaves this machine.\n" +
			"The call is recorded in the audit log; nothing withdraws the credentials before they expire.\n\n" +
			"Roles:\n" +
			"  observer  read-only: stream, consumer and object store listings and reads, subscriptions\n" +
			"            to fl.> (every message of the protocol); it publishes on no Fleetlearn subject\n" +
			"  operator  an observer that may also add, fetch from and delete consumers, and see the\n" +
			"            account's connection reports; it cannot change streams, buckets or messages either\n" +
			"  system    the system account's monitoring requests: nats server list, server report\n" +
			"            jetstream, server report connections; no account updates, reloads or kicks",
		Example: "  fleetlearn nats creds --role observer -o observer.creds\n" +
			"  nats --server tls://HOST:4222 --creds observer.creds --tlsca ca.crt stream ls\n" +
			"  fleetlearn nats creds --role system -o system.creds --ttl 1h\n" +
			"  nats --server tls://HOST:4222 --creds system.creds --tlsca ca.crt server report jetstream",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, ok := natsRoles[role]
			if !ok {
				return fmt.Errorf("%w: --role %q: want observer, operator or system", ErrUsage, role)
			}
			if out == "" {
				return fmt.Errorf("%w: -o FILE is required (- writes the creds to standard output)", ErrUsage)
			}
			if ttl <= 0 {
				return fmt.Errorf("%w: --ttl must be positive", ErrUsage)
			}
			if name != "" {
				if err := wire.CheckToken("--name", name); err != nil {
					return fmt.Errorf("%w: %w", ErrUsage, err)
				}
			}
			key, err := identity.GenerateUserKey()
			if err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewNATSServiceClient(conn).IssueCredentials(ctx, &pb.IssueCredentialsRequest{
					PublicKey: key.ID(), Role: r, Ttl: durationpb.New(ttl), Name: name})
				if err != nil {
					return err
				}
				claims, err := natsjwt.DecodeUserClaims(res.GetUserJwt())
				if err != nil {
					return fmt.Errorf("%w: the server's user JWT: %w", ErrProtocol, err)
				}
				if claims.Subject != key.ID() {
					return fmt.Errorf("%w: the server's user JWT is for %s, not the key %s made here", ErrProtocol, claims.Subject, key.ID())
				}
				creds, err := identity.FormatCreds(res.GetUserJwt(), key.Seed())
				if err != nil {
					return err
				}
				info := cmd.OutOrStdout()
				if out == "-" {
					if _, err := cmd.OutOrStdout().Write(creds); err != nil {
						return err
					}
					info = cmd.ErrOrStderr()
				} else if err := atomicfile.WriteFile(out, creds, 0o600); err != nil {
					return fmt.Errorf("nats creds: %w", err)
				}
				return a.printCredsUsage(info, role, out, key.ID(), res)
			})
		},
	}
	cmd.Flags().StringVar(&role, "role", "", "observer, operator or system")
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write the creds to (mode 0600); - for standard output")
	cmd.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the credentials stay valid (at most 30 days)")
	cmd.Flags().StringVar(&name, "name", "", "user name in the servers' connection reports (default: the role)")
	return cmd
}

// printCredsUsage says what the credentials are and how to use them with
// the nats CLI.
func (a *app) printCredsUsage(w io.Writer, role, file, key string, res *pb.IssueCredentialsResponse) error {
	natsURL := res.GetNatsUrl()
	if natsURL == "" {
		natsURL = "nats://HOST:4222"
	}
	if file == "-" {
		file = "FILE"
	}
	flags := "--server " + shellQuote(natsURL) + " --creds " + shellQuote(file)
	subFlags := "--nats-url " + shellQuote(natsURL) + " --creds " + shellQuote(file)
	if u, err := url.Parse(natsURL); err == nil && u.Scheme == "tls" {
		ca := "ca.crt"
		if a.caFile != "" {
			ca = a.caFile
		}
		flags += " --tlsca " + shellQuote(ca)
		subFlags += " --ca " + shellQuote(ca)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s NATS credentials for user %s, valid until %s, in %s\n", role, key,
		timeString(res.GetExpireTime()), file)
	b.WriteString("Use them with the nats CLI (github.com/nats-io/natscli):\n")
	switch role {
	case string(identity.NATSSystem):
		fmt.Fprintf(&b, "  nats %s server list\n", flags)
		fmt.Fprintf(&b, "  nats %s server report jetstream\n", flags)
	default:
		fmt.Fprintf(&b, "  nats %s stream ls\n", flags)
		fmt.Fprintf(&b, "  nats %s obj ls %s\n", flags, wire.BlobBucket)
		fmt.Fprintf(&b, "  nats %s sub 'fl.>'\n", flags)
		b.WriteString("or print the Fleetlearn messages as JSON:\n")
		fmt.Fprintf(&b, "  fleetlearn nats sub 'fl.>' %s\n", subFlags)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func newNATSSubCommand(a *app) *cobra.Command {
	var natsURL, creds string
	var count int
	cmd := &cobra.Command{
		Use:   "sub SUBJECT [--creds FILE] [--nats-url URL] [--count N]",
		Short: "Print the Fleetlearn messages on a NATS subject as JSON lines",
		Long: "sub subscribes to SUBJECT (wildcards allowed) and prints each message as one JSON object:\n" +
			"its subject, reply subject and headers, and the protocol message the subject carries\n" +
			"(protojson, proto field names) under \"message\" with its type under \"type\". Headers-only\n" +
			"notices (fl.stored.>) print their headers; a JSON body (JetStream API replies and acks)\n" +
			"prints under \"json\", the audit checkpoint note under \"text\", anything else as\n" +
			"\"data_base64\". A body that does not decode as its subject's type keeps \"type\" and gets\n" +
			"\"error\".\n\n" +
			"--ca (or $" + CAEnv + ") is the CA a tls:// NATS URL's certificate must chain to: the\n" +
			"server's <data-dir>/tls/ca.crt.",
		Example: "  fleetlearn nats sub 'fl.>' --creds observer.creds --nats-url tls://HOST:4222 --ca ca.crt\n" +
			"  fleetlearn nats sub 'fl.report.>' --count 3 | jq .message.metrics.values",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 0 {
				return fmt.Errorf("%w: --count must not be negative", ErrUsage)
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			return a.natsSub(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), natsURL, creds, args[0], count)
		},
	}
	cmd.Flags().StringVar(&natsURL, "nats-url", nats.DefaultURL, "the server's NATS URL; $"+NATSURLEnv+" sets the default")
	cmd.Flags().StringVar(&creds, "creds", "",
		"NATS creds `FILE` written by fleetlearn nats creds; $"+NATSCredsEnv+" sets the default")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many messages (0: until interrupted)")
	return cmd
}

// natsSub prints the messages on subject until ctx ends or count have
// been printed.
func (a *app) natsSub(ctx context.Context, w, errw io.Writer, natsURL, creds, subject string, count int) error {
	// nats.go calls the error handler on its own goroutine, possibly after
	// Close: once this function returns, errw is the caller's again.
	var errMu sync.Mutex
	returned := false
	defer func() {
		errMu.Lock()
		returned = true
		errMu.Unlock()
	}()
	opts := []nats.Option{nats.Name("fleetlearn nats sub"), nats.PermissionErrOnSubscribe(true),
		// A server restart pauses the subscription rather than ending it.
		nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			errMu.Lock()
			defer errMu.Unlock()
			if !returned {
				fmt.Fprintf(errw, "nats sub: %v\n", err)
			}
		})}
	if creds != "" {
		opts = append(opts, nats.UserCredentials(creds))
	}
	if a.caFile != "" {
		ca, err := a.natsCA()
		if err != nil {
			return err
		}
		opts = append(opts, ca)
	}
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return a.natsError(natsURL, creds, err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		return fmt.Errorf("nats sub %s: %w", subject, err)
	}
	// Every message is kept until printed: a slow terminal must not make
	// the client drop some silently.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return fmt.Errorf("nats sub %s: %w", subject, err)
	}
	// The server answers a refused subscription before the flush's PONG.
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("nats sub %s: %w", subject, err)
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		return fmt.Errorf("nats sub %s: %w (these credentials may not subscribe there)", subject, err)
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for n := 0; count == 0 || n < count; n++ {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("nats sub %s: %w", subject, err)
		}
		if err := enc.Encode(describeMsg(m)); err != nil {
			return err
		}
	}
	return nil
}

// natsCA trusts --ca for the NATS server's certificate without asking
// for TLS: nats.RootCAs would, and $FLEETLEARN_CA, set for the API, must
// not keep sub off a server whose NATS is plain. A tls:// URL, or a server
// that requires TLS, still gets it, checked against this CA.
func (a *app) natsCA() (nats.Option, error) {
	b, err := os.ReadFile(a.caFile)
	if err != nil {
		return nil, fmt.Errorf("%w: --ca: %w", ErrInput, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%w: --ca %s holds no PEM certificate", ErrInput, a.caFile)
	}
	return func(o *nats.Options) error {
		o.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		return nil
	}, nil
}

// natsError explains a failed connection.
func (a *app) natsError(natsURL, creds string, err error) error {
	msg := fmt.Sprintf("nats %s: %v", natsURL, err)
	switch {
	case errors.Is(err, nats.ErrAuthorization) && creds == "":
		msg += " (pass --creds with a file from `fleetlearn nats creds`, or set $" + NATSCredsEnv + ")"
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired):
		msg += " (the credentials expired or are not this server's: get new ones with `fleetlearn nats creds`)"
	case strings.Contains(err.Error(), "certificate") && a.caFile == "":
		msg += " (is --ca set to the server's CA certificate, <data-dir>/tls/ca.crt?)"
	case errors.Is(err, nats.ErrNoServers):
		msg += " (is --nats-url the server's NATS address?)"
	}
	return errors.New(msg)
}

// natsLine is one message as `nats sub` prints it.
type natsLine struct {
	Subject string              `json:"subject"`
	Reply   string              `json:"reply,omitempty"`
	Headers map[string][]string `json:"headers,omitempty"`
	Type    string              `json:"type,omitempty"`
	Message json.RawMessage     `json:"message,omitempty"`
	Text    string              `json:"text,omitempty"`
	JSON    json.RawMessage     `json:"json,omitempty"`
	Data    []byte              `json:"data_base64,omitempty"`
	Error   string              `json:"error,omitempty"`
}

// Kinds of body a subject carries besides protocol buffers.
const (
	bodyNone = "none" // headers-only notices
	bodyNote = "note" // signed-note text
)

// subjectBody says what travels on subject (docs/PROTOCOL.md, Subjects):
// a new protocol message, or one of the other kinds; nil and "" when the
// subject is not the protocol's.
func subjectBody(subject string) (proto.Message, string) {
	tail := func(prefix string, tokens int) bool {
		rest, ok := strings.CutPrefix(subject, prefix)
		if !ok {
			return false
		}
		parts := strings.Split(rest, ".")
		if len(parts) != tokens {
			return false
		}
		for _, p := range parts {
			if wire.CheckToken("subject token", p) != nil {
				return false
			}
		}
		return true
	}
	switch {
	case strings.HasPrefix(subject, wire.SubjectStoredPrefix):
		return nil, bodyNone
	case subject == wire.SubjectAnnounce:
		return &pb.RoundAnnouncement{}, ""
	case subject == wire.SubjectAuditCheckpoint:
		return nil, bodyNote
	}
	if _, err := wire.ParseCheckInSubject(subject); err == nil {
		return &pb.CheckIn{}, ""
	}
	if _, _, _, err := wire.ParseFailureSubject(subject); err == nil {
		return &pb.PlanFailure{}, ""
	}
	if _, _, _, err := wire.ParseReportSubject(subject); err == nil {
		if wire.IsEvalSubject(subject) {
			return &pb.EvaluationReport{}, ""
		}
		return &pb.UpdateReport{}, ""
	}
	if _, _, _, err := wire.ParseSecAggUpSubject(subject); err == nil {
		return &pb.SecAggUp{}, ""
	}
	switch {
	case tail("fl.secagg.down.", 3):
		return &pb.SecAggDown{}, ""
	case tail("fl.receipt.", 1):
		return &pb.ReportReceipt{}, ""
	case tail("fl.events.", 1):
		return &pb.RoundEvent{}, ""
	}
	return nil, ""
}

// describeMsg decodes m by its subject.
func describeMsg(m *nats.Msg) natsLine {
	l := natsLine{Subject: m.Subject, Reply: m.Reply}
	if len(m.Header) > 0 {
		l.Headers = m.Header
	}
	msg, kind := subjectBody(m.Subject)
	switch {
	case msg != nil:
		l.Type = string(msg.ProtoReflect().Descriptor().FullName())
		if err := proto.Unmarshal(m.Data, msg); err != nil {
			l.Error, l.Data = err.Error(), m.Data
			return l
		}
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(msg)
		if err != nil {
			l.Error, l.Data = err.Error(), m.Data
			return l
		}
		l.Message = b
	case len(m.Data) == 0:
		// A headers-only notice, or a status message (no responders, a
		// JetStream heartbeat): the headers say it all.
	case kind == bodyNote && utf8.Valid(m.Data):
		l.Text = string(m.Data)
	case json.Valid(m.Data):
		l.JSON = m.Data
	default:
		if kind == bodyNone {
			l.Error = "a headers-only subject carried a body"
		}
		l.Data = m.Data
	}
	return l
}
