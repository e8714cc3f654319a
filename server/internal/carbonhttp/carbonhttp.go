// Package carbonhttp fetches carbon-intensity forecasts from a provider over
// HTTP for the pool's carbon-aware placement: it is pool/carbon's Source for
// a URL, kept out of pool/, which makes no network calls.
package carbonhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/fleetlearn/fleetlearn/pool/carbon"
)

// ErrFetch reports a provider that could not be asked or answered wrongly.
var ErrFetch = errors.New("carbon forecast provider")

// DefaultTimeout bounds one fetch.
const DefaultTimeout = 30 * time.Second

// Source asks a Carbon Aware SDK (or any server answering in a layout
// carbon.Parse reads) for the current forecasts at URL, e.g.
// https://carbon-aware.example.net/emissions/forecasts/current?location=westus&location=eastus.
// The answer must be 200 with a JSON content type and at most
// carbon.MaxInputBytes; it is parsed and validated like a file.
type Source struct {
	URL string
	// Token, when set, is sent as a bearer token.
	Token string
	// Client makes the request; nil is a client with DefaultTimeout.
	Client *http.Client
}

// New checks the URL: https, or http to a loopback host (a provider
// running beside the server); anything else would send the token and
// trust the answer in the clear.
func New(raw, token string, client *http.Client) (*Source, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("carbon forecast URL %q: want https://HOST/PATH: %w", raw, ErrFetch)
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && isLoopback(u.Hostname()):
	default:
		return nil, fmt.Errorf("carbon forecast URL %q: use https (plain http only to a provider on loopback): %w", raw, ErrFetch)
	}
	if client == nil {
		client = &http.Client{Timeout: DefaultTimeout}
	}
	return &Source{URL: raw, Token: token, Client: client}, nil
}

// Forecasts fetches, bounds and parses the provider's answer.
func (s *Source) Forecasts(ctx context.Context) ([]carbon.Forecast, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("carbon forecast: %w: %w", ErrFetch, err)
	}
	req.Header.Set("Accept", "application/json")
	if s.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.Token)
	}
	res, err := s.Client.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("carbon forecast: %w: %w", ErrFetch, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("carbon forecast: %w: %s answered %s", ErrFetch, req.URL.Redacted(), res.Status)
	}
	if mt, _, err := mime.ParseMediaType(res.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, nil, fmt.Errorf("carbon forecast: %w: %s answered %q, not JSON", ErrFetch, req.URL.Redacted(), res.Header.Get("Content-Type"))
	}
	b, err := io.ReadAll(io.LimitReader(res.Body, carbon.MaxInputBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("carbon forecast: %w: %w", ErrFetch, err)
	}
	if len(b) > carbon.MaxInputBytes {
		return nil, nil, fmt.Errorf("carbon forecast: %w: more than %d bytes", carbon.ErrTooLarge, carbon.MaxInputBytes)
	}
	fs, err := carbon.Parse(b)
	if err != nil {
		return nil, nil, fmt.Errorf("carbon forecast from %s: %w", req.URL.Redacted(), err)
	}
	return fs, b, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
