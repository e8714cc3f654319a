package ui

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

func staticHandler() http.Handler {
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	fsrv := http.FileServer(http.FS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Assets change only with the binary.
		w.Header().Set("Cache-Control", "private, max-age=300")
		fsrv.ServeHTTP(w, r)
	})
}

var funcs = template.FuncMap{
	"ts": func(t *timestamppb.Timestamp) string {
		if t == nil || !t.IsValid() || t.AsTime().IsZero() {
			return "—"
		}
		return t.AsTime().UTC().Format("2006-01-02 15:04:05Z")
	},
	"time": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"num": func(v float64) string {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return "—"
		}
		return strconv.FormatFloat(v, 'g', 6, 64)
	},
	"pct": func(a, b float64) string {
		if b <= 0 {
			return "0"
		}
		return strconv.FormatFloat(math.Min(100, 100*a/b), 'f', 1, 64)
	},
	"lower":   strings.ToLower,
	"float":   func(v uint32) float64 { return float64(v) },
	"mul":     func(a, b float64) float64 { return a * b },
	"enumJob": func(s pb.PoolJobState) string { return enum(s, "POOL_JOB_STATE_") },
	"short": func(s string) string {
		if len(s) > 12 {
			return s[:12] + "…"
		}
		return s
	},
}

// pages are parsed once, each with the layout.
var pages = func() map[string]*template.Template {
	out := map[string]*template.Template{}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		panic(err)
	}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		out[name] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n))
	}
	return out
}()

// frame is what the layout needs around every page.
type frame struct {
	Title  string
	Nav    string
	Viewer *viewer
	// Live is the event stream the page's script listens to ("" for none).
	Live string
	Data any
}

func (h *Handler) render(w http.ResponseWriter, code int, page string, v *viewer, data any) {
	h.renderFrame(w, code, page, frame{Viewer: v, Data: data})
}

func (h *Handler) renderFrame(w http.ResponseWriter, code int, page string, f frame) {
	t, ok := pages[page]
	if !ok {
		http.Error(w, "no template "+page, http.StatusInternalServerError)
		return
	}
	var b bytes.Buffer
	if err := t.Execute(&b, f); err != nil {
		h.o.log.Error("dashboard page failed", "page", page, "err", err)
		http.Error(w, "the page could not be drawn; the server log has the reason", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(b.Bytes())
}

// page runs a handler that returns the page to draw, drawing API errors
// as such.
func (h *Handler) page(f func(*http.Request, *viewer) (string, frame, error)) http.Handler {
	return h.session(func(w http.ResponseWriter, r *http.Request, v *viewer) {
		name, fr, err := f(r, v)
		if err != nil {
			h.fail(w, r, v, err)
			return
		}
		fr.Viewer = v
		h.renderFrame(w, http.StatusOK, name, fr)
	})
}

// denied is a section of a page the viewer's roles may not see.
type denied struct{ Msg string }

// section turns an API error into a note for the page when the viewer may
// not call it, so that the rest of the page still shows.
func (h *Handler) section(v *viewer, err error) (*denied, error) {
	if status.Code(err) == codes.PermissionDenied {
		return &denied{Msg: h.deniedMessage(v, err)}, nil
	}
	return nil, err
}

// fail draws an error page with the status the API's code maps to.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, v *viewer, err error) {
	code, msg := http.StatusBadGateway, err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
		switch s.Code() {
		case codes.PermissionDenied:
			code = http.StatusForbidden
			msg = "Your roles do not allow this: " + h.deniedMessage(v, err)
		case codes.Unauthenticated:
			h.clearCookie(w)
			h.toLogin(w, r, "Your session ended ("+msg+"). Sign in with a current token.")
			return
		case codes.NotFound:
			code = http.StatusNotFound
		case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
			code = http.StatusBadRequest
		case codes.Unavailable, codes.Unimplemented:
			code = http.StatusServiceUnavailable
		}
	} else if errors.Is(err, errNotFound) {
		code = http.StatusNotFound
	} else {
		h.o.log.Warn("dashboard request failed", "path", r.URL.Path, "err", err)
	}
	h.renderFrame(w, code, "error", frame{Title: http.StatusText(code), Viewer: v,
		Data: struct {
			Code int
			Msg  string
		}{code, msg}})
}

func errorf(format string, args ...any) error { return fmt.Errorf("ui: "+format, args...) }
