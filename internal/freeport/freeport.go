// Package freeport picks loopback TCP ports for tests that must name a
// port before something binds it: a child process, a cluster whose nodes
// route to each other's addresses.
//
// A port the kernel hands out for ":0" lies in its ephemeral range, where
// every outgoing connection of every process on the machine also takes its
// local port; between the pick and the bind, a parallel test's client can
// take it. The ports here come from below that range, at random, and are
// checked free when picked, which makes a collision rare instead of common
// on a busy machine. It stays possible: callers that can report their
// listener's failure should.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// low is the least port handed out: above the well-known and the usual
// registered service ports that tests could meet on a developer's machine.
const low = 20000

// ErrNoPort is returned when no free port was found below the ephemeral range.
var ErrNoPort = errors.New("freeport: no free loopback port below the ephemeral range")

// Get returns a TCP port that was free on 127.0.0.1 when it was picked.
func Get() (int, error) {
	high := ephemeralLow() - 1
	if high <= low {
		// An unusual range leaves nothing below it: take the kernel's pick.
		return kernelPick()
	}
	for range 64 {
		p := low + rand.IntN(high-low+1)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	return 0, ErrNoPort
}

// Must is Get for tests: it fails t when no port is found.
func Must(t testing.TB) int {
	t.Helper()
	p, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Addr is Must as a "127.0.0.1:port" address.
func Addr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Must(t)))
}

// ephemeralLow is the first port of the kernel's ephemeral range: Linux's
// setting when readable, else the IANA range's start, which BSDs, macOS
// and Windows use.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 0 {
				return n
			}
		}
	}
	return 49152
}

func kernelPick() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("freeport: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
