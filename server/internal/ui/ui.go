// Package ui is the aggregator's web dashboard: server-rendered pages of the
// fleet, tasks and rounds, the audit log and the compute pool, built only
// from the server's own gRPC API with the viewer's bearer token, so the
// API's roles decide what each viewer sees and may do. Charts are SVG from
// gonum/plot, drawn on the server; the pages load one embedded script and
// one stylesheet under a strict Content-Security-Policy, and live updates
// arrive as server-sent events.
package ui

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/clock"
)

// Config connects the dashboard to the API it is built on.
type Config struct {
	// API is a connection to the server's gRPC API without credentials of
	// its own: every call carries the viewer's token.
	API grpc.ClientConnInterface
	// Authenticate verifies a bearer token as the API does, to greet the
	// viewer and to leave out actions their roles may not take.
	Authenticate func(token string) (identity.Principal, error)
	// Policy is the API's role table (identity.DefaultPolicy when nil).
	Policy *identity.Policy
	// Secure marks the session cookie Secure: the dashboard is served over
	// TLS.
	Secure bool
}

// Option adjusts a Handler.
type Option func(*options)

type options struct {
	log          *slog.Logger
	clock        clock.Clock
	refresh      time.Duration
	maxStreams   int
	perPrincipal int
	reserve      int
	reserveSet   bool // else a quarter of maxStreams
	refused      func(reason string)
}

// WithLogger logs failed API calls and refused logins (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithClock drives the live pages' refresh ticks (default: the system clock).
func WithClock(c clock.Clock) Option { return func(o *options) { o.clock = c } }

// WithRefresh sets how often pages without an event stream of their own
// (overview, devices, audit, pool) are told to refresh (default 5 s).
func WithRefresh(d time.Duration) Option { return func(o *options) { o.refresh = d } }

// WithMaxStreams bounds the live-update streams open at once (default 256);
// beyond it a page still loads but is not kept live.
func WithMaxStreams(n int) Option { return func(o *options) { o.maxStreams = n } }

// WithStreamsPerPrincipal bounds the live-update streams one principal (a
// token's subject) holds at once (default 4: a browser holds at most six
// connections to a site over HTTP/1.1, and pages need some for themselves).
func WithStreamsPerPrincipal(n int) Option { return func(o *options) { o.perPrincipal = n } }

// WithStreamReserve keeps the last n of the WithMaxStreams streams for
// admins, operators and auditors (default a quarter of them): viewers with
// none of those roles, such as pool-worker tokens any job script can read,
// cannot take them.
func WithStreamReserve(n int) Option { return func(o *options) { o.reserve, o.reserveSet = n, true } }

// WithStreamRefused is called with one of StreamRefusals for every stream
// refused, for a metric.
func WithStreamRefused(f func(reason string)) Option { return func(o *options) { o.refused = f } }

// Handler serves the dashboard.
type Handler struct {
	cfg     Config
	o       options
	mux     *http.ServeMux
	csrfKey []byte
	streams *streamGate
	plans   planCache // ε plans for the privacy chart (epsilon.go)
}

const (
	cookieName = "fleetlearn_session"
	// maxTokenBytes bounds what a login form or cookie may carry; API
	// tokens are a few hundred bytes.
	maxTokenBytes = 8 << 10
)

// csp allows only the dashboard's own script, stylesheet and images (the
// charts), its own event streams and forms, and no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// New builds the dashboard's handler.
func New(cfg Config, opts ...Option) (*Handler, error) {
	if cfg.API == nil || cfg.Authenticate == nil {
		return nil, fmt.Errorf("ui: %w: the API connection and the token check are required", ErrConfig)
	}
	if cfg.Policy == nil {
		cfg.Policy = identity.DefaultPolicy()
	}
	cfg.API = namedCalls{cfg.API}
	o := options{log: slog.New(slog.DiscardHandler), refresh: 5 * time.Second, maxStreams: 256, perPrincipal: 4}
	for _, opt := range opts {
		opt(&o)
	}
	o.clock = clock.Or(o.clock)
	if o.refresh <= 0 || o.maxStreams <= 0 || o.perPrincipal <= 0 {
		return nil, fmt.Errorf("ui: %w: refresh, stream limit and streams per principal must be positive", ErrConfig)
	}
	if !o.reserveSet {
		o.reserve = o.maxStreams / 4
	}
	if o.reserve < 0 || o.reserve >= o.maxStreams {
		return nil, fmt.Errorf("ui: %w: a stream reserve of %d: want 0 or more, and fewer than the %d streams, so that viewers keep some",
			ErrConfig, o.reserve, o.maxStreams)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("ui: csrf key: %w", err)
	}
	h := &Handler{cfg: cfg, o: o, mux: http.NewServeMux(), csrfKey: key,
		streams: newStreamGate(o.maxStreams, o.perPrincipal, o.reserve)}
	h.routes()
	return h, nil
}

func (h *Handler) routes() {
	m := h.mux
	m.Handle("GET /static/", http.StripPrefix("/static/", staticHandler()))
	// Browsers ask for it on every site; there is none, and a 404 is noise
	// in the console the browser tests read.
	m.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.HandleFunc("GET /login", h.loginPage)
	m.HandleFunc("POST /login", h.login)
	m.HandleFunc("POST /logout", h.logout)
	m.Handle("GET /{$}", h.page(h.overview))
	m.Handle("GET /devices", h.page(h.devicesPage))
	m.Handle("POST /devices/{id}/revoke", h.action(h.revokeDevice))
	m.Handle("GET /tasks/{id}", h.page(h.taskPage))
	m.Handle("GET /tasks/{id}/charts/{metric}", h.session(h.taskChart))
	m.Handle("GET /tasks/{id}/privacy/chart", h.session(h.taskEpsilonChart))
	m.Handle("GET /tasks/{id}/events", h.session(h.taskEvents))
	m.Handle("POST /tasks/{id}/stop", h.action(h.stopTask))
	m.Handle("POST /tasks/{id}/resume", h.action(h.resumeTask))
	m.Handle("GET /tasks/{id}/rounds/{round}", h.page(h.roundPage))
	m.Handle("GET /audit", h.page(h.auditPage))
	m.Handle("GET /audit/entries/{index}", h.page(h.entryPage))
	m.Handle("GET /pool", h.page(h.poolPage))
	m.Handle("GET /pool/jobs/{id}", h.page(h.jobPage))
	m.Handle("POST /pool/jobs/{id}/cancel", h.action(h.cancelJob))
	m.Handle("GET /events", h.session(h.refreshEvents))
}

// ServeHTTP sets the security headers every response carries.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: under no-referrer browsers send
	// "Origin: null" with form posts, which sameOrigin must refuse.
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cache-Control", "no-store")
	if h.cfg.Secure {
		hd.Set("Strict-Transport-Security", "max-age=31536000")
	}
	h.mux.ServeHTTP(w, r)
}

// viewer is who is looking, with the token their API calls carry.
type viewer struct {
	identity.Principal
	token string
	CSRF  string
}

// may reports whether the viewer's roles allow the gRPC method.
func (h *Handler) may(v *viewer, method string) bool {
	return h.cfg.Policy.Authorize(method, v.Principal) == nil
}

// ctx carries the viewer's token to the API.
func (v *viewer) ctx(r *http.Request) context.Context {
	return metadata.AppendToOutgoingContext(r.Context(), "authorization", "Bearer "+v.token)
}

type viewerKey struct{}

// viewerOf is the session's viewer, or nil (and a redirect to the login
// page, or 401 for a script) when there is no valid one.
func (h *Handler) viewerOf(w http.ResponseWriter, r *http.Request) *viewer {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" || len(c.Value) > maxTokenBytes {
		h.toLogin(w, r, "")
		return nil
	}
	p, err := h.cfg.Authenticate(c.Value)
	if err != nil {
		h.clearCookie(w)
		h.toLogin(w, r, "Your session ended ("+err.Error()+"). Sign in with a current token.")
		return nil
	}
	return &viewer{Principal: p, token: c.Value, CSRF: h.csrfFor(c.Value)}
}

func (h *Handler) toLogin(w http.ResponseWriter, r *http.Request, msg string) {
	if r.Method != http.MethodGet || strings.HasSuffix(r.URL.Path, "/events") || strings.Contains(r.URL.Path, "/charts/") ||
		strings.HasSuffix(r.URL.Path, "/privacy/chart") {
		http.Error(w, "not signed in: open /login and sign in with an API token", http.StatusUnauthorized)
		return
	}
	q := url.Values{}
	if msg != "" {
		q.Set("msg", msg)
	}
	if r.URL.Path != "/" {
		q.Set("next", r.URL.Path)
	}
	target := "/login"
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// session runs f for a signed-in viewer.
func (h *Handler) session(f func(http.ResponseWriter, *http.Request, *viewer)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := h.viewerOf(w, r); v != nil {
			f(w, r, v)
		}
	})
}

// csrfFor binds a form token to the session's bearer token, so a form
// from one session cannot be replayed in another, and no state is kept.
func (h *Handler) csrfFor(token string) string {
	m := hmac.New(sha256.New, h.csrfKey)
	m.Write([]byte(token))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// sameOrigin refuses cross-site form posts: browsers send Origin with
// every POST, and SameSite=Strict keeps the cookie off them anyway.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		// Sec-Fetch-Site is sent by every current browser; a client
		// without either is not a browser riding a session.
		s := r.Header.Get("Sec-Fetch-Site")
		return s == "" || s == "same-origin"
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// action runs a state-changing form post: same origin, a session, and the
// session's form token.
func (h *Handler) action(f func(http.ResponseWriter, *http.Request, *viewer) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		if !sameOrigin(r) {
			http.Error(w, "cross-origin form post refused", http.StatusForbidden)
			return
		}
		v := h.viewerOf(w, r)
		if v == nil {
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(v.CSRF)) != 1 {
			http.Error(w, "the form is stale or from another session: reload the page and try again", http.StatusForbidden)
			return
		}
		if err := f(w, r, v); err != nil {
			h.fail(w, r, v, err)
		}
	})
}

func (h *Handler) setCookie(w http.ResponseWriter, token string, expires time.Time) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: token, Path: "/", Expires: expires,
		HttpOnly: true, Secure: h.cfg.Secure, SameSite: http.SameSiteStrictMode})
}

func (h *Handler) clearCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: h.cfg.Secure, SameSite: http.SameSiteStrictMode})
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, http.StatusOK, "login", nil, loginData{Msg: r.URL.Query().Get("msg"), Next: safeNext(r.URL.Query().Get("next"))})
}

type loginData struct{ Msg, Next string }

// safeNext keeps post-login redirects on this site.
func safeNext(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") {
		return "/"
	}
	return p
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxTokenBytes+1024)
	if !sameOrigin(r) {
		http.Error(w, "cross-origin sign-in refused", http.StatusForbidden)
		return
	}
	tok := strings.TrimSpace(r.PostFormValue("token"))
	next := safeNext(r.PostFormValue("next"))
	if tok == "" || len(tok) > maxTokenBytes {
		h.render(w, http.StatusBadRequest, "login", nil, loginData{Msg: "Paste an API token (fleetlearn token mint prints one).", Next: next})
		return
	}
	p, err := h.cfg.Authenticate(tok)
	if err != nil {
		h.o.log.Info("dashboard sign-in refused", "err", err)
		h.render(w, http.StatusUnauthorized, "login", nil, loginData{Msg: "That token was refused: " + err.Error(), Next: next})
		return
	}
	h.setCookie(w, tok, p.Expires)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		http.Error(w, "cross-origin form post refused", http.StatusForbidden)
		return
	}
	h.clearCookie(w)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// redirectBack sends the browser to path after an action.
func redirectBack(w http.ResponseWriter, r *http.Request, path string) {
	http.Redirect(w, r, path, http.StatusSeeOther)
}

// errNotFound is a page the URL names that does not exist.
var errNotFound = errors.New("no such page")
