package natsembed_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/natstest"
	"github.com/fleetlearn/fleetlearn/server/internal/natsembed"
)

func TestMonitorAddress(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:8222": "127.0.0.1:8222",
		":8222":          "0.0.0.0:8222",
		"[::1]:8222":     "::1:8222",
		"nats.lan:1":     "nats.lan:1",
	} {
		var o natsserver.Options
		if err := natsembed.Monitor(&o, addr); err != nil {
			t.Errorf("Monitor(%q): %v", addr, err)
			continue
		}
		if got := fmt.Sprintf("%s:%d", o.HTTPHost, o.HTTPPort); got != want {
			t.Errorf("Monitor(%q) listens on %s, want %s", addr, got, want)
		}
	}
	for _, addr := range []string{"", "8222", "127.0.0.1", "127.0.0.1:0", ":0", "127.0.0.1:-1", "127.0.0.1:65536", "127.0.0.1:http"} {
		o := natsserver.Options{HTTPPort: 7}
		if err := natsembed.Monitor(&o, addr); !errors.Is(err, natsembed.ErrMonitorAddr) {
			t.Errorf("Monitor(%q) = %v, want %v", addr, err, natsembed.ErrMonitorAddr)
		}
		if o.HTTPPort != 7 {
			t.Errorf("refused Monitor(%q) changed the options", addr)
		}
	}
}

// getJSON fetches a monitoring endpoint and decodes its JSON object.
func getJSON(t *testing.T, url string) map[string]any {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, res.Status)
	}
	var v map[string]any
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return v
}

// An operator-mode server with Monitor serves the endpoints the nats CLI
// and exporters read, with JetStream on.
func TestMonitorServes(t *testing.T) {
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
	if err := natsembed.Monitor(opts, "127.0.0.1:8222"); err != nil {
		t.Fatal(err)
	}
	// The test takes whatever port is free and asks the server which.
	opts.HTTPPort = natsserver.RANDOM_PORT
	ns := natstest.Run(t, opts)
	addr := ns.MonitorAddr()
	if addr == nil || !addr.IP.IsLoopback() {
		t.Fatalf("monitor listens on %v, want loopback", addr)
	}
	base := "http://" + addr.String()
	if v := getJSON(t, base+"/varz"); v["server_id"] != ns.ID() || v["system_account"] != auth.SystemAccountPublicKey() {
		t.Errorf("/varz: server_id %v, system_account %v; want %s, %s", v["server_id"], v["system_account"], ns.ID(), auth.SystemAccountPublicKey())
	}
	if v := getJSON(t, base+"/jsz"); v["config"] == nil {
		t.Errorf("/jsz has no JetStream config: %v", v)
	}
	getJSON(t, base+"/connz")
}
