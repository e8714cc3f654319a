package server

import (
	"testing"

	"github.com/fleetlearn/fleetlearn/pool/carbon"
	"github.com/fleetlearn/fleetlearn/server/internal/carbonhttp"
)

// A forecast file is read as a file, with no HTTP client in sight; only a
// URL makes a provider source, and an insecure one is refused at start.
func TestCarbonSourceKinds(t *testing.T) {
	if s, err := carbonSource(""); s != nil || err != nil {
		t.Fatalf("none: %v %v", s, err)
	}
	if s, err := carbonSource("/etc/fleetlearn/forecast.json"); err != nil {
		t.Fatal(err)
	} else if _, ok := s.(carbon.FileSource); !ok {
		t.Fatalf("a path gave %T", s)
	}
	if s, err := carbonSource("https://carbon.example.net/emissions/forecasts/current?location=westus"); err != nil {
		t.Fatal(err)
	} else if _, ok := s.(*carbonhttp.Source); !ok {
		t.Fatalf("a URL gave %T", s)
	}
	if _, err := carbonSource("http://carbon.example.net/f"); err == nil {
		t.Fatal("plain http to another host accepted")
	}
}
