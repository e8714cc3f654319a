package natsembed_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/natstest"
	"github.com/fleetlearn/fleetlearn/internal/objfetch"
	"github.com/fleetlearn/fleetlearn/proto/wire"
	"github.com/fleetlearn/fleetlearn/server/internal/natsembed"
)

// fleet is a real nats-server in operator mode under a fresh authority.
type fleet struct {
	auth *identity.Authority
	ns   *natsserver.Server
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	auth, err := identity.LoadOrCreateAuthority("fleetlearn", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	acct, err := auth.AccountJWT(nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := natstest.Options(t)
	if err := natsembed.Configure(opts, auth, acct); err != nil {
		t.Fatal(err)
	}
	return &fleet{auth: auth, ns: natstest.Run(t, opts)}
}

// errRecorder collects a connection's asynchronous errors.
type errRecorder struct {
	mu   sync.Mutex
	errs []error
	ch   chan error
}

func newErrRecorder() *errRecorder { return &errRecorder{ch: make(chan error, 64)} }

func (r *errRecorder) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
	select {
	case r.ch <- err:
	default:
	}
}

// hang bounds the waits for what must happen: long enough that only a
// hang, not a loaded machine, reaches it, and short of the test binary's
// timeout so that the failure still says what was seen.
const hang = 2 * time.Minute

// expectViolation waits for a permissions violation mentioning subject.
func (r *errRecorder) expectViolation(t *testing.T, subject string) {
	t.Helper()
	deadline := time.After(hang)
	for {
		select {
		case err := <-r.ch:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
				return
			}
		case <-deadline:
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Fatalf("no permissions violation for %s; errors seen: %v", subject, r.errs)
		}
	}
}

func (f *fleet) connect(t *testing.T, key *identity.UserKey, userJWT string, extra ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	opts := append([]nats.Option{
		nats.UserJWT(func() (string, error) { return userJWT, nil }, key.Sign),
		nats.MaxReconnects(2),
		nats.ReconnectWait(50 * time.Millisecond),
	}, extra...)
	nc, err := nats.Connect(f.ns.ClientURL(), opts...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// device enrolls a device and connects it the way the agent must.
func (f *fleet) device(t *testing.T, id string) (*nats.Conn, *identity.UserKey, *errRecorder) {
	t.Helper()
	key, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	userJWT, err := f.auth.DeviceUserJWT(id, key.ID(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	rec := newErrRecorder()
	nc, err := f.connect(t, key, userJWT, nats.CustomInboxPrefix(identity.DeviceInboxPrefix(id)), nats.ErrorHandler(rec.handler))
	if err != nil {
		t.Fatalf("device %s: %v", id, err)
	}
	return nc, key, rec
}

func (f *fleet) service(t *testing.T) *nats.Conn {
	t.Helper()
	key, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	userJWT, err := f.auth.ServiceUserJWT("fleetlearn-server", key.ID(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := f.connect(t, key, userJWT)
	if err != nil {
		t.Fatalf("service: %v", err)
	}
	return nc
}

func receive(t *testing.T, sub *nats.Subscription) *nats.Msg {
	t.Helper()
	m, err := sub.NextMsg(hang)
	if err != nil {
		t.Fatalf("%s: %v", sub.Subject, err)
	}
	return m
}

func TestNATSDevicePermissions(t *testing.T) {
	ctx := t.Context()
	f := startFleet(t)

	// The aggregator: the reports stream, the blob bucket, a check-in responder.
	svc := f.service(t)
	js, err := jetstream.New(svc)
	if err != nil {
		t.Fatal(err)
	}
	reports, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.StreamReports, Subjects: wire.StreamSubjects,
		Duplicates: time.Hour, RePublish: &jetstream.RePublish{Source: ">", Destination: wire.SubjectStoredPrefix + ">", HeadersOnly: true}})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: wire.BlobBucket})
	if err != nil {
		t.Fatal(err)
	}
	blob := bytes.Repeat([]byte("model "), 50_000) // several chunks
	sha := wire.SHA256(blob)
	if _, err := obs.PutBytes(ctx, sha, blob); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Subscribe(wire.SubjectCheckIns, func(m *nats.Msg) { _ = m.Respond(append([]byte("plan for "), m.Data...)) }); err != nil {
		t.Fatal(err)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}

	a, _, aerr := f.device(t, "devA")
	b, _, _ := f.device(t, "devB")

	t.Run("check-in", func(t *testing.T) {
		m, err := a.RequestWithContext(ctx, wire.CheckInSubject("devA"), []byte("devA"))
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Data) != "plan for devA" {
			t.Fatalf("reply %q", m.Data)
		}
	})

	t.Run("report into FL_REPORTS", func(t *testing.T) {
		ajs, err := jetstream.New(a)
		if err != nil {
			t.Fatal(err)
		}
		subj := wire.ReportSubject("task1", 3, "devA")
		ack, err := ajs.Publish(ctx, subj, []byte("update"), jetstream.WithMsgID(wire.MsgID("report", "task1", 3, "devA")))
		if err != nil {
			t.Fatal(err)
		}
		if ack.Stream != wire.StreamReports {
			t.Fatalf("stored in %q", ack.Stream)
		}
		if _, err := ajs.Publish(ctx, wire.EvalSubject("task1", 3, "devA"), []byte("eval")); err != nil {
			t.Fatal(err)
		}
		// The chunks of a report too large for one message, on its own chunk subject.
		if _, err := ajs.Publish(ctx, wire.ChunkSubject("task1", 3, "devA"), []byte("chunk")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("blob by direct get", func(t *testing.T) {
		ajs, err := jetstream.New(a)
		if err != nil {
			t.Fatal(err)
		}
		bk, err := objfetch.Open(ctx, ajs, wire.BlobBucket)
		if err != nil {
			t.Fatal(err)
		}
		got, err := bk.Get(ctx, sha, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, blob) {
			t.Fatalf("got %d bytes, want %d", len(got), len(blob))
		}
	})

	t.Run("broadcasts and own subjects", func(t *testing.T) {
		var subs []*nats.Subscription
		for _, s := range []string{wire.SubjectAnnounce, wire.SubjectAuditCheckpoint, wire.ReceiptSubject("devA"), wire.SecAggDownSubject("task1", 3, "devA")} {
			sub, err := a.SubscribeSync(s)
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, sub)
		}
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		for _, sub := range subs {
			if err := svc.Publish(sub.Subject, []byte("to "+sub.Subject)); err != nil {
				t.Fatal(err)
			}
		}
		for _, sub := range subs {
			if m := receive(t, sub); string(m.Data) != "to "+sub.Subject {
				t.Fatalf("%s: %q", sub.Subject, m.Data)
			}
		}
		// SecAgg up is a request the server answers.
		up, err := svc.Subscribe(wire.SubjectSecAggUp, func(m *nats.Msg) { _ = m.Respond([]byte("ack")) })
		if err != nil {
			t.Fatal(err)
		}
		defer up.Unsubscribe()
		if err := svc.Flush(); err != nil {
			t.Fatal(err)
		}
		if _, err := a.RequestWithContext(ctx, wire.SecAggUpSubject("task1", 3, "devA"), []byte("adv")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("denied", func(t *testing.T) {
		for _, subj := range []string{
			wire.CheckInSubject("devB"), // impersonating another device's check-in
			"fl.checkin",
			wire.ReportSubject("task1", 3, "devB"),
			wire.EvalSubject("task1", 3, "devB"),
			wire.SecAggUpSubject("task1", 3, "devB"),
			wire.ChunkSubject("task1", 3, "devB"), // a chunk for another device's report
			wire.ReceiptSubject("devB"),
			wire.SubjectAnnounce,
			wire.SubjectAuditCheckpoint,
			"fl.stored.fl.report.task1.3.devA",
			"$JS.API.STREAM.DELETE." + wire.StreamReports,
			"$JS.API.STREAM.PURGE.OBJ_" + wire.BlobBucket,
			"$O." + wire.BlobBucket + ".C.forged",
			"$JS.API.CONSUMER.CREATE." + wire.StreamReports,
		} {
			if err := a.Publish(subj, []byte("forged")); err != nil {
				t.Fatal(err)
			}
			aerr.expectViolation(t, "Publish to \""+subj+"\"")
		}
		for _, subj := range []string{
			wire.ReceiptSubject("devB"),
			identity.DeviceInboxPrefix("devB") + ".>",
			wire.SecAggDownSubject("task1", 3, "devB"),
			wire.SubjectStored,
			wire.EventsSubject("task1"),
			wire.SubjectCheckIns,
			"fl.report.>",
			"_INBOX.>",
			">",
		} {
			sub, err := a.SubscribeSync(subj)
			if err != nil {
				t.Fatal(err)
			}
			aerr.expectViolation(t, "Subscription to \""+subj+"\"")
			_ = sub.Unsubscribe()
		}
		// Nothing forged reached the stream: only devA's two reports and its chunk are there.
		info, err := reports.Info(ctx, jetstream.WithSubjectFilter("fl.>"))
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 3 || len(info.State.Subjects) != 3 || info.State.Subjects[wire.ReportSubject("task1", 3, "devB")] != 0 ||
			info.State.Subjects[wire.ChunkSubject("task1", 3, "devB")] != 0 {
			t.Fatalf("stream holds %d messages on %v", info.State.Msgs, info.State.Subjects)
		}
		// B's connection is unaffected by A's violations.
		if _, err := b.RequestWithContext(ctx, wire.CheckInSubject("devB"), []byte("devB")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("default inbox refused", func(t *testing.T) {
		key, err := identity.GenerateUserKey()
		if err != nil {
			t.Fatal(err)
		}
		userJWT, err := f.auth.DeviceUserJWT("devC", key.ID(), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		rec := newErrRecorder()
		c, err := f.connect(t, key, userJWT, nats.ErrorHandler(rec.handler))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		if _, err := c.RequestWithContext(rctx, wire.CheckInSubject("devC"), nil); err == nil {
			t.Fatal("a device without its inbox prefix got a reply")
		}
		rec.expectViolation(t, "Subscription to \"_INBOX.")
	})
}

func TestNATSRevocation(t *testing.T) {
	ctx := t.Context()
	f := startFleet(t)
	svc := f.service(t)
	if _, err := svc.Subscribe(wire.SubjectCheckIns, func(m *nats.Msg) { _ = m.Respond([]byte("ok")) }); err != nil {
		t.Fatal(err)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}

	sysKey, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	sysJWT, err := f.auth.SystemUserJWT("fleetlearn-admin", sysKey.ID(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	sys, err := f.connect(t, sysKey, sysJWT)
	if err != nil {
		t.Fatal(err)
	}

	keyA, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	jwtA, err := f.auth.DeviceUserJWT("devA", keyA.ID(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	rec := newErrRecorder()
	a, err := f.connect(t, keyA, jwtA, nats.CustomInboxPrefix(identity.DeviceInboxPrefix("devA")),
		nats.ErrorHandler(rec.handler), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := f.device(t, "devB")
	if _, err := a.RequestWithContext(ctx, wire.CheckInSubject("devA"), nil); err != nil {
		t.Fatal(err)
	}

	revokedAt := time.Now()
	acct, err := f.auth.AccountJWT([]identity.Revocation{{UserKey: keyA.ID(), At: revokedAt}})
	if err != nil {
		t.Fatal(err)
	}
	if err := natsembed.PushAccount(ctx, sys, acct); err != nil {
		t.Fatal(err)
	}

	// The live connection is dropped, and its reconnects are refused.
	select {
	case <-closed:
	case <-time.After(hang):
		t.Fatalf("revoked device still connected: status %v, errors %v", a.Status(), rec.errs)
	}
	if !errors.Is(a.LastError(), nats.ErrAuthorization) && !errors.Is(a.LastError(), nats.ErrAuthRevoked) {
		t.Errorf("last error %v, want an authorization error", a.LastError())
	}
	_, err = f.connect(t, keyA, jwtA, nats.CustomInboxPrefix(identity.DeviceInboxPrefix("devA")))
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("reconnecting revoked device: %v, want %v", err, nats.ErrAuthorization)
	}
	// Revocation covers the JWTs issued up to its second; nats-server
	// accepts one issued later for the same key. Refusing to certify a
	// revoked key again is the enrollment service's job.
	time.Sleep(time.Until(revokedAt.Truncate(time.Second).Add(time.Second)))
	jwtA2, err := f.auth.DeviceUserJWT("devA", keyA.ID(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.connect(t, keyA, jwtA2); err != nil {
		t.Fatalf("JWT issued after the revocation: %v", err)
	}
	// Others stay connected.
	if _, err := b.RequestWithContext(ctx, wire.CheckInSubject("devB"), nil); err != nil {
		t.Fatalf("device B after A's revocation: %v", err)
	}
	// An account JWT for FLEET signed by another operator, lifting the
	// revocation, is refused.
	rogue, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	ac := natsjwt.NewAccountClaims(f.auth.AccountPublicKey())
	ac.Limits.JetStreamLimits = natsjwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	forged, err := ac.Encode(rogue)
	if err != nil {
		t.Fatal(err)
	}
	if err := natsembed.PushAccount(ctx, sys, forged); !errors.Is(err, natsembed.ErrUpdateRefused) {
		t.Fatalf("push of a rogue operator's account: %v", err)
	}
	if _, err := f.connect(t, keyA, jwtA); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("revoked device after rogue push: %v", err)
	}
}

// A device user JWT without its key is useless: the account refuses bearer JWTs.
func TestNATSBearerRefused(t *testing.T) {
	f := startFleet(t)
	key, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	other, err := identity.GenerateUserKey()
	if err != nil {
		t.Fatal(err)
	}
	userJWT, err := f.auth.DeviceUserJWT("devA", key.ID(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.connect(t, other, userJWT); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("JWT signed nonce with another key: %v", err)
	}
	if _, err := nats.Connect(f.ns.ClientURL()); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connect: %v", err)
	}
	// A user JWT from another authority is refused.
	o, err := identity.LoadOrCreateAuthority("other", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := o.ServiceUserJWT("svc", key.ID(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.connect(t, key, foreign); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("foreign service JWT: %v", err)
	}
}
