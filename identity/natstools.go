package identity

import (
	"fmt"
	"time"

	natsjwt "github.com/nats-io/jwt/v2"
)

// NATSToolRole is what a person's tool (the official nats CLI, fleetlearn
// nats sub) may do on NATS with credentials from ToolUserJWT.
type NATSToolRole string

// The tool roles. Neither FLEET role may publish on fl.> or change a
// stream, bucket or message: the protocol's subjects belong to the server
// and the devices.
const (
	// NATSObserver reads: JetStream stream, consumer and object store
	// listings and contents, and subscriptions to fl.> and _INBOX.>.
	NATSObserver NATSToolRole = "observer"
	// NATSOperator is an observer that may also manage consumers (add
	// durable ones, fetch and acknowledge from them, delete them) and see
	// the account's connection and statistics reports.
	NATSOperator NATSToolRole = "operator"
	// NATSSystem is a user of the system account limited to the servers'
	// monitoring requests and events: nats server list, server report
	// jetstream, server report connections, server info.
	NATSSystem NATSToolRole = "system"
)

// NATSToolRoles lists the tool roles.
var NATSToolRoles = []NATSToolRole{NATSObserver, NATSOperator, NATSSystem}

// jsReads are the JetStream API requests that only read: account, stream
// and consumer info and listings, message gets, and the ephemeral consumers
// (with their pulls and flow control replies) that stream views and object
// store reads run on. The streams FL_REPORTS and OBJ_fl_blobs retain by
// limits, so a consumer never removes a message.
var jsReads = []string{
	"$JS.API.INFO",
	"$JS.API.STREAM.NAMES",
	"$JS.API.STREAM.LIST",
	"$JS.API.STREAM.INFO.*",
	"$JS.API.STREAM.MSG.GET.*",
	"$JS.API.DIRECT.GET.*",
	"$JS.API.DIRECT.GET.*.>",
	"$JS.API.CONSUMER.NAMES.*",
	"$JS.API.CONSUMER.LIST.*",
	"$JS.API.CONSUMER.INFO.*.*",
	"$JS.API.CONSUMER.CREATE.*",
	"$JS.API.CONSUMER.CREATE.*.>",
	"$JS.API.CONSUMER.MSG.NEXT.*.*",
	"$JS.FC.>",
	// The caller's own user info (nats account info).
	"$SYS.REQ.USER.INFO",
}

// consumerAdmin is what the operator role adds: durable consumers, their
// acknowledgements, deleting consumers (the ephemeral ones tools leave
// behind), and the account-scoped connection and statistics reports the
// system account serves every account.
var consumerAdmin = []string{
	"$JS.API.CONSUMER.DURABLE.CREATE.*.*",
	"$JS.API.CONSUMER.DELETE.*.*",
	"$JS.ACK.>",
	"$SYS.REQ.ACCOUNT.PING.CONNZ",
	"$SYS.REQ.ACCOUNT.PING.STATZ",
	"$SYS.REQ.SERVER.PING.CONNZ",
}

// monitorRequests are nats-server's read-only monitoring requests, asked of
// one server ($SYS.REQ.SERVER.<id>.<kind>) or all ($SYS.REQ.SERVER.PING.<kind>;
// "*" matches both). PROFILEZ is left out: it runs a CPU profile on the
// server. KICK, LDM and RELOAD are not monitoring.
var monitorRequests = []string{"IDZ", "STATSZ", "VARZ", "SUBSZ", "CONNZ", "ROUTEZ", "GATEWAYZ", "LEAFZ",
	"ACCOUNTZ", "JSZ", "HEALTHZ", "EXPVARZ", "IPQUEUESZ", "RAFTZ"}

// accountRequests are the read-only requests about one account
// ($SYS.REQ.ACCOUNT.<account>.<kind>); CLAIMS requests are not among them.
var accountRequests = []string{"SUBSZ", "CONNZ", "LEAFZ", "JSZ", "INFO", "CONNS", "STATZ"}

// ToolPermissions are exactly what role may do on NATS. Replies come on
// the default inbox prefix "_INBOX.", which the FLEET roles may subscribe
// to: the server's own replies there carry what an observer may read
// anyway (JetStream API answers and report messages).
func ToolPermissions(role NATSToolRole) (natsjwt.Permissions, error) {
	var p natsjwt.Permissions
	switch role {
	case NATSObserver, NATSOperator:
		p.Pub.Allow.Add(jsReads...)
		if role == NATSOperator {
			p.Pub.Allow.Add(consumerAdmin...)
		}
		p.Sub.Allow.Add("fl.>", "_INBOX.>")
	case NATSSystem:
		p.Pub.Allow.Add("$SYS.REQ.SERVER.PING", "$SYS.REQ.USER.INFO")
		for _, k := range monitorRequests {
			p.Pub.Allow.Add("$SYS.REQ.SERVER.*." + k)
		}
		for _, k := range accountRequests {
			p.Pub.Allow.Add("$SYS.REQ.ACCOUNT.*." + k)
		}
		// Server and account events (nats events), not requests: a
		// subscriber to $SYS.REQ.> could answer in the servers' place.
		p.Sub.Allow.Add("_INBOX.>", "$SYS.SERVER.>", "$SYS.ACCOUNT.>")
	default:
		return natsjwt.Permissions{}, fmt.Errorf("identity: tool permissions: %w: role %q (want observer, operator or system)", ErrBadInput, role)
	}
	return p, nil
}

// ToolUserJWT certifies that the holder of userKey (a "U..." id) may use
// NATS in role until expires, which must be set: tool credentials are not
// in the registry, so nothing but their expiry withdraws them. The system
// role's user belongs to the system account, the others to FLEET. name
// labels the user in the servers' connection reports.
func (a *Authority) ToolUserJWT(role NATSToolRole, name, userKey string, expires time.Time) (string, error) {
	const op = "identity: tool user jwt"
	perms, err := ToolPermissions(role)
	if err != nil {
		return "", err
	}
	if expires.IsZero() {
		return "", fmt.Errorf("%s: %w: tool credentials must expire", op, ErrBadInput)
	}
	acct := a.account
	if role == NATSSystem {
		acct = a.system
	}
	return a.userJWT("tool user jwt", name, userKey, acct, perms, expires)
}
