package ui

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// heartbeat keeps idle event streams open through proxies that drop
// silent connections.
const heartbeat = 20 * time.Second

// streamRetry is how long a refused page waits before asking again
// (Retry-After): long enough that refused pages do not hammer the server,
// short enough that a tab closed elsewhere soon makes room.
const streamRetry = 30 * time.Second

// admit takes one of the dashboard's live-update streams for the viewer,
// or answers the refusal: 429 when the viewer holds its own share, 503
// when the dashboard's streams (or those left to viewers of its roles)
// are taken, each with Retry-After and a sentence the page shows.
// release must be called when the stream ends.
func (h *Handler) admit(w http.ResponseWriter, v *viewer) (release func(), ok bool) {
	release, why := h.streams.acquire(v.Principal)
	if why == "" {
		return release, true
	}
	if h.o.refused != nil {
		h.o.refused(why)
	}
	h.o.log.Info("dashboard live stream refused", "subject", v.Subject, "reason", why)
	w.Header().Set("Retry-After", strconv.Itoa(int(streamRetry/time.Second)))
	switch why {
	case StreamRefusedPrincipal:
		http.Error(w, fmt.Sprintf("Live updates are off on this page: you already have %d live dashboard pages open. "+
			"Close one, or reload this page later.", h.o.perPrincipal), http.StatusTooManyRequests)
	case StreamRefusedReserved:
		http.Error(w, "Live updates are off on this page: the dashboard's live streams for your roles are all in use "+
			"(the rest are kept for operators and auditors). Reload this page later.", http.StatusServiceUnavailable)
	default:
		http.Error(w, "Live updates are off on this page: the dashboard's live streams are all in use. Reload this page later.",
			http.StatusServiceUnavailable)
	}
	return nil, false
}

// begin starts a server-sent event response.
func begin(w http.ResponseWriter, fl http.Flusher) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
}

func flusher(w http.ResponseWriter) (http.Flusher, bool) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
	}
	return fl, ok
}

// roundUpdate is what a task page learns from an event: enough to decide
// to redraw, nothing a page could not fetch itself.
type roundUpdate struct {
	Task  string `json:"task"`
	Round uint64 `json:"round"`
	Type  string `json:"type"`
	State string `json:"state"`
}

// taskEvents relays WatchTask as server-sent events, under the viewer's
// token: the API decides whether they may watch.
func (h *Handler) taskEvents(w http.ResponseWriter, r *http.Request, v *viewer) {
	id := r.PathValue("id")
	// A watch sends nothing until the next round event, and a refusal
	// arrives with the first message: ask first, so that a refused or
	// unknown task is an HTTP error rather than a stream that never speaks.
	if !h.may(v, apiv1.TaskService_WatchTask_FullMethodName) {
		http.Error(w, "your roles may not watch tasks", http.StatusForbidden)
		return
	}
	fl, ok := flusher(w)
	if !ok {
		return
	}
	// The slot is taken before the API is asked, so that a refused page
	// costs the server no watch.
	release, ok := h.admit(w, v)
	if !ok {
		return
	}
	defer release()
	if _, err := h.tasks().GetTask(v.ctx(r), &pb.GetTaskRequest{TaskId: id}); err != nil {
		h.fail(w, r, v, err)
		return
	}
	st, err := h.tasks().WatchTask(v.ctx(r), &pb.WatchTaskRequest{TaskId: id})
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	begin(w, fl)
	flush := fl.Flush
	msgs := make(chan *pb.WatchTaskResponse, 1)
	go func() {
		defer close(msgs)
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			case <-r.Context().Done():
				return
			}
		}
	}()
	tick := h.o.clock.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C():
			fmt.Fprint(w, ": ping\n\n")
			flush()
		case m, open := <-msgs:
			if !open {
				fmt.Fprint(w, "event: end\ndata: {}\n\n")
				flush()
				return
			}
			u := roundUpdate{Task: m.GetTask().GetId(), Round: m.GetEvent().GetRound(),
				Type: enum(m.GetEvent().GetType(), "ROUND_EVENT_TYPE_"), State: enum(m.GetTask().GetState(), "TASK_STATE_")}
			b, _ := json.Marshal(u)
			fmt.Fprintf(w, "event: round\ndata: %s\n\n", b)
			flush()
		}
	}
}

// refreshEvents tells pages without an event source of their own to
// redraw, on the injected clock.
func (h *Handler) refreshEvents(w http.ResponseWriter, r *http.Request, v *viewer) {
	fl, ok := flusher(w)
	if !ok {
		return
	}
	release, ok := h.admit(w, v)
	if !ok {
		return
	}
	defer release()
	begin(w, fl)
	flush := fl.Flush
	tick := h.o.clock.NewTicker(h.o.refresh)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case t := <-tick.C():
			fmt.Fprintf(w, "event: refresh\ndata: {\"time\":%q}\n\n", t.UTC().Format(time.RFC3339))
			flush()
		}
	}
}
