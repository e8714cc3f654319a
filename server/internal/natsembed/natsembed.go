// Package natsembed connects an identity.Authority to nats-server: it sets
// the operator-mode options of an embedded server and pushes account JWT
// updates (revocations) to a running server or cluster through the system
// account. Only the server runs nats-server, so this lives under server/:
// package identity, which devices and the CLI import too, stays free of
// networking and of the nats-server dependency.
package natsembed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"

	natsjwt "github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetlearn/fleetlearn/identity"
)

// ErrUpdateRefused reports a server that did not accept an account JWT.
var ErrUpdateRefused = errors.New("natsembed: account update refused")

// ErrMonitorAddr reports a monitoring address that is not "host:port"
// with a port from 1 to 65535.
var ErrMonitorAddr = errors.New("natsembed: monitoring address must be host:port, the port from 1 to 65535")

// Configure puts opts in operator mode under a: it trusts a's operator,
// names its system account, and installs an in-memory resolver preloaded
// with the system account and accountJWT (from a.AccountJWT). Everything
// else in opts (ports, JetStream, store directory) is left alone.
//
// The memory resolver keeps updates pushed while the server runs
// (PushAccount) but not across restarts: build accountJWT from the current
// revocation list at every start.
func Configure(opts *server.Options, a *identity.Authority, accountJWT string) error {
	const op = "natsembed: configure"
	opJWT, err := a.OperatorJWT()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	oc, err := natsjwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	sysJWT, err := a.SystemAccountJWT()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	ac, err := natsjwt.DecodeAccountClaims(accountJWT)
	if err != nil {
		return fmt.Errorf("%s: account jwt: %w", op, err)
	}
	if ac.Issuer != a.OperatorPublicKey() || ac.Subject != a.AccountPublicKey() {
		return fmt.Errorf("%s: account jwt for %s issued by %s is not this authority's %s account", op, ac.Subject, ac.Issuer, identity.FleetAccount)
	}
	res := &server.MemAccResolver{}
	for k, j := range map[string]string{a.SystemAccountPublicKey(): sysJWT, a.AccountPublicKey(): accountJWT} {
		if err := res.Store(k, j); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	opts.TrustedOperators = []*natsjwt.OperatorClaims{oc}
	opts.TrustedKeys = nil
	opts.SystemAccount = a.SystemAccountPublicKey()
	opts.AccountResolver = res
	return nil
}

// updateSubject is where every server of a cluster takes account JWT
// updates, whichever resolver it runs (memory or full).
func updateSubject(account string) string {
	return "$SYS.REQ.ACCOUNT." + account + ".CLAIMS.UPDATE"
}

type claimUpdateResponse struct {
	Data *struct {
		Account string `json:"account"`
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
	Error *struct {
		Account     string `json:"account"`
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// PushAccount sends accountJWT to the servers over sys, a connection
// authenticated as a system account user (identity.Authority.SystemUserJWT),
// and waits for a server to accept it. The servers apply the new claims at
// once: connections of users revoked in it are closed with "User
// Authentication Revoked" and cannot authenticate again.
func PushAccount(ctx context.Context, sys *nats.Conn, accountJWT string) error {
	const op = "natsembed: push account"
	ac, err := natsjwt.DecodeAccountClaims(accountJWT)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	msg, err := sys.RequestWithContext(ctx, updateSubject(ac.Subject), []byte(accountJWT))
	if err != nil {
		return fmt.Errorf("%s: %s: %w", op, ac.Subject, err)
	}
	var r claimUpdateResponse
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return fmt.Errorf("%s: %s: reply: %w", op, ac.Subject, err)
	}
	switch {
	case r.Error != nil:
		return fmt.Errorf("%w: %s: %s (code %d)", ErrUpdateRefused, ac.Subject, r.Error.Description, r.Error.Code)
	case r.Data == nil || r.Data.Code != 200:
		return fmt.Errorf("%w: %s: unexpected reply %q", ErrUpdateRefused, ac.Subject, msg.Data)
	}
	return nil
}

// Monitor makes opts serve nats-server's HTTP monitoring endpoints (/varz,
// /jsz, /connz, /healthz …) on addr, "host:port". An empty host listens on
// every interface, as net.Listen would (nats-server itself would take the
// client listen host). Port 0 is refused: nats-server reads it as "off",
// and a port picked at random would be one nobody can find. The endpoints
// have no authentication and show connections, with device ids and
// addresses.
func Monitor(opts *server.Options, addr string) error {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: %q", ErrMonitorAddr, addr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return fmt.Errorf("%w: %q", ErrMonitorAddr, addr)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	opts.HTTPHost, opts.HTTPPort = host, port
	return nil
}
