package carbonhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/fleetlearn/fleetlearn/pool/carbon"
	"github.com/fleetlearn/fleetlearn/server/internal/carbonhttp"
)

func sdkForecast(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../../pool/carbon/testdata/carbon-aware-sdk.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFetchesAndParses(t *testing.T) {
	body := sdkForecast(t)
	var auth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Write(body)
	}))
	defer srv.Close()
	s, err := carbonhttp.New(srv.URL+"/emissions/forecasts/current?location=westus", "tok", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	fs, raw, err := s.Forecasts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want, err := carbon.Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	if carbon.Digest(fs) != carbon.Digest(want) || string(raw) != string(body) || auth != "Bearer tok" {
		t.Fatalf("digest %s, want %s; raw %d bytes; auth %q", carbon.Digest(fs), carbon.Digest(want), len(raw), auth)
	}
}

func TestRefusesBadAnswers(t *testing.T) {
	for name, h := range map[string]http.HandlerFunc{
		"status": func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", http.StatusServiceUnavailable) },
		"html": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<html>"))
		},
		"huge": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte("[" + strings.Repeat(" ", carbon.MaxInputBytes) + "]"))
		},
		"not a forecast": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"hello":"world"}`))
		},
	} {
		srv := httptest.NewServer(h)
		s, err := carbonhttp.New(srv.URL, "", srv.Client())
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Forecasts(context.Background()); err == nil {
			t.Errorf("%s: accepted", name)
		}
		srv.Close()
	}
}

func TestRefusesInsecureURLs(t *testing.T) {
	for _, u := range []string{"http://provider.example.net/f", "ftp://x/y", "not a url", "https://"} {
		if _, err := carbonhttp.New(u, "", nil); !errors.Is(err, carbonhttp.ErrFetch) {
			t.Errorf("%s: %v, want ErrFetch", u, err)
		}
	}
	for _, u := range []string{"https://provider.example.net/f", "http://127.0.0.1:8080/f", "http://localhost/f"} {
		if _, err := carbonhttp.New(u, "", nil); err != nil {
			t.Errorf("%s: %v", u, err)
		}
	}
}
