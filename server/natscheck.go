package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetlearn/fleetlearn/internal/backoff"
	"github.com/fleetlearn/fleetlearn/internal/clock"
	"github.com/fleetlearn/fleetlearn/server/internal/natsx"
)

// ErrNATSOpen is returned by Start when an external NATS server admits a
// client that presents no credentials: it does not enforce the server's
// operator, so device permissions and revocations would mean nothing.
var ErrNATSOpen = errors.New("the NATS server admits clients without credentials")

// ErrNATSUntrusted is returned by Start when an external NATS server
// refuses the aggregator's own credentials: it does not trust the operator
// in the data directory.
var ErrNATSUntrusted = errors.New("the NATS server refuses this aggregator's credentials")

// natsProbeTimeout bounds one probe connection: a NATS server answers its
// INFO and CONNECT in milliseconds.
const natsProbeTimeout = 10 * time.Second

// checkExternalNATS makes sure every reachable server of the external
// cluster at urls enforces this aggregator's operator: a client without
// credentials is refused, and the aggregator's service user is admitted.
// Servers that cannot be reached yet are waited for, with back-off, until
// at least one has answered; one that answers wrongly ends the start.
func (s *Server) checkExternalNATS(ctx context.Context, urls string, service nats.Option) error {
	b := backoff.New(time.Second, 30*time.Second, nil)
	for {
		judged, last, err := s.probeNATS(urls, service)
		if err != nil || judged > 0 {
			return err
		}
		if err := s.sleep(ctx, b, "waiting for the external NATS cluster", "url", urls, "err", last); err != nil {
			return fmt.Errorf("server: waiting for NATS at %s: %w", urls, ctx.Err())
		}
	}
}

// probeNATS dials each of urls twice, anonymously and as the service user,
// and returns how many answered and, when none did, the last reason.
func (s *Server) probeNATS(urls string, service nats.Option) (judged int, last, err error) {
	authDir := filepath.Join(s.cfg.DataDir, NATSAuthDir)
	for raw := range strings.SplitSeq(urls, ",") {
		u := strings.TrimSpace(raw)
		// Credentials in the URL would make the anonymous dial not anonymous.
		anon := u
		if p, err := url.Parse(u); err == nil && p.User != nil {
			p.User = nil
			anon = p.String()
		}
		nc, err := nats.Connect(anon, nats.Name("fleetlearn-server-probe"), nats.NoReconnect(), nats.Timeout(natsProbeTimeout))
		switch {
		case err == nil:
			nc.Close()
			return 0, nil, fmt.Errorf("server: NATS at %s: %w: it does not enforce this aggregator's operator, so device "+
				"permissions and revocation would mean nothing. Include the fragment that "+
				"'fleetlearn-server --data-dir %s --write-nats-config FILE' writes in every NATS server's configuration "+
				"(deploy/README.md), or pass --insecure-nats to run without authorization", u, ErrNATSOpen, s.cfg.DataDir)
		case !isAuthError(err):
			last = fmt.Errorf("%s: %w", anon, err)
			continue
		}
		nc, err = nats.Connect(u, nats.Name("fleetlearn-server-probe"), nats.NoReconnect(), nats.Timeout(natsProbeTimeout), service)
		switch {
		case err == nil:
			nc.Close()
			judged++
		case isAuthError(err):
			return 0, nil, fmt.Errorf("server: NATS at %s: %w (%v): its configuration does not trust the operator in %s. "+
				"Include the fragment that 'fleetlearn-server --data-dir %s --write-nats-config FILE' writes in every NATS "+
				"server's configuration and reload it", u, ErrNATSUntrusted, err, authDir, s.cfg.DataDir)
		default:
			last = fmt.Errorf("%s: %w", u, err)
		}
	}
	return judged, last, nil
}

func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), nats.AUTHORIZATION_ERR)
}

// MaxReplicas caps the replicas chosen for the reports stream and the blob
// bucket on a cluster: three copies survive the loss of a node, and more
// only slow writes down.
const MaxReplicas = 3

// clusterReplicas is the replica count that follows the external cluster:
// min(MaxReplicas, the JetStream meta group's size), read from the
// connected server's JSZ over the system account. Without that connection
// (InsecureNATS) a clustered server cannot be sized: the caller says to set
// Config.Replicas.
func (s *Server) clusterReplicas(ctx context.Context) (int, error) {
	var sys *nats.Conn
	if s.natsAuthority != nil {
		s.natsAuthority.mu.Lock()
		sys = s.natsAuthority.sys
		s.natsAuthority.mu.Unlock()
	}
	if sys == nil {
		if s.nc.ConnectedClusterName() != "" {
			return 0, fmt.Errorf("server: NATS at %s is clustered (%q) but its size cannot be read without authorization: set --replicas",
				s.nc.ConnectedUrlRedacted(), s.nc.ConnectedClusterName())
		}
		return 1, nil
	}
	// A cluster whose nodes start together (a StatefulSet) elects its
	// meta leader seconds after they listen; until then its size is not
	// settled, so wait for the leader.
	b := backoff.New(500*time.Millisecond, 10*time.Second, nil)
	for {
		size, leader, err := s.metaCluster(ctx, sys)
		switch {
		case errors.Is(err, nats.ErrNoResponders) && ctx.Err() == nil:
			// A node that has just started takes clients a moment before
			// it answers its $SYS requests: wait for it as for a leader.
			if err := s.sleep(ctx, b, "waiting for the NATS server to answer its system requests", "err", err); err != nil {
				return 0, err
			}
			continue
		case err != nil:
			return 0, err
		case size == 0:
			return 1, nil // not clustered
		case leader:
			return min(MaxReplicas, size), nil
		}
		if err := s.sleep(ctx, b, "waiting for the JetStream cluster to elect a leader", "cluster_size", size); err != nil {
			return 0, err
		}
	}
}

// metaCluster reads the connected server's JSZ: the JetStream meta group's
// size (0 when the server is not clustered) and whether it has a leader.
func (s *Server) metaCluster(ctx context.Context, sys *nats.Conn) (size int, leader bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	id := s.nc.ConnectedServerId()
	if id == "" {
		if err := s.nc.FlushWithContext(ctx); err != nil {
			return 0, false, fmt.Errorf("server: NATS: %w", err)
		}
		id = s.nc.ConnectedServerId()
	}
	msg, err := sys.RequestWithContext(ctx, "$SYS.REQ.SERVER."+id+".JSZ", nil)
	if err != nil {
		return 0, false, fmt.Errorf("server: NATS cluster size (JSZ of %s): %w", id, err)
	}
	var resp struct {
		Data struct {
			Meta *struct {
				Size   int    `json:"cluster_size"`
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		} `json:"data"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, false, fmt.Errorf("server: NATS cluster size: %w", err)
	}
	if resp.Error != nil {
		return 0, false, fmt.Errorf("server: NATS cluster size: %s", resp.Error.Description)
	}
	if resp.Data.Meta == nil {
		return 0, false, nil
	}
	return max(resp.Data.Meta.Size, 1), resp.Data.Meta.Leader != "", nil
}

// sleep waits out b's next step on the injected clock, warning why.
func (s *Server) sleep(ctx context.Context, b *backoff.Backoff, why string, attrs ...any) error {
	wait := b.Next()
	s.o.log.Warn(why, append(attrs, "attempt", b.Attempts(), "retry_in", wait)...)
	if !clock.Sleep(s.o.clock, wait, ctx.Done()) {
		return fmt.Errorf("server: %s: %w", why, ctx.Err())
	}
	return nil
}

// reportStoreBytes is the reports stream's size limit: the configured
// one, or the default, which on the embedded server leaves room for the
// blob bucket (models and modules) on a small disk.
func (s *Server) reportStoreBytes() int64 {
	if n := s.cfg.ReportStoreBytes; n != 0 {
		return n
	}
	n := int64(DefaultReportStoreBytes)
	if s.embedded != nil {
		if store := s.embedded.MaxStore(); store > 0 {
			n = min(n, store/2)
		}
	}
	return n
}

// JetStream API error codes (nats-server's errors.json) after which the
// same request succeeds once a forming cluster settles.
const (
	jsNoSuitablePeers = 10005 // JSClusterNoPeersErrF: peers not known yet
	jsUnavailable     = 10008 // JSClusterNotAvailErr: no meta leader yet
)

// setupJetStream creates or updates the reports stream and the blob bucket,
// waiting with back-off while a cluster is still forming: its first
// requests fail with "no suitable peers" or time out though it is healthy
// a moment later. Other refusals end the start at once.
func (s *Server) setupJetStream(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.Stream, jetstream.ObjectStore, error) {
	b := backoff.New(500*time.Millisecond, 10*time.Second, nil)
	for {
		stream, obs, err := natsx.Setup(ctx, js, s.cfg.MaxMessageBytes, replicas, s.reportStoreBytes())
		if err == nil {
			return stream, obs, nil
		}
		var apiErr *jetstream.APIError
		transient := errors.As(err, &apiErr) && (apiErr.ErrorCode == jsNoSuitablePeers || apiErr.ErrorCode == jsUnavailable) ||
			ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
				errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled))
		if !transient || s.embedded != nil {
			return nil, nil, fmt.Errorf("%w (JetStream replicas: %d; set --replicas to at most the number of JetStream servers)", err, replicas)
		}
		if err := s.sleep(ctx, b, "waiting for the JetStream cluster to place the reports stream and blob bucket",
			"replicas", replicas, "err", err); err != nil {
			return nil, nil, err
		}
	}
}

// checkReplicas reads back what the cluster made of the reports stream: a
// stream left at fewer replicas (an update refused, a peer missing) would
// lose reports with its one node, and the operator must know at start.
func (s *Server) checkReplicas(ctx context.Context, stream jetstream.Stream, want int) error {
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("server: reports stream: %w", err)
	}
	if got := info.Config.Replicas; got != want {
		return fmt.Errorf("server: reports stream has %d replicas, want %d: the cluster did not apply the update", got, want)
	}
	peers := 1
	if info.Cluster != nil {
		peers += len(info.Cluster.Replicas)
	}
	if peers < want {
		s.o.log.Warn("reports stream has fewer peers than replicas: a node is down or the stream is being placed",
			"replicas", want, "peers", peers)
	}
	if s.embedded == nil {
		s.o.log.Info("JetStream replicas of reports and blobs", "replicas", want, "peers", peers)
	}
	return nil
}
