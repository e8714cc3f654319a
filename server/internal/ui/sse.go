package ui

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// heartbeat keeps idle event streams open through proxies that drop
// silent connections.
const heartbeat = 20 * time.Second

// stream starts a server-sent event response, or refuses it when the
// dashboard already holds its limit of open streams; release must be
// called when it ends.
func (h *Handler) stream(w http.ResponseWriter) (flush func(), release func(), ok bool) {
	fl, can := w.(http.Flusher)
	if !can {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return nil, nil, false
	}
	if h.streams.Add(1) > h.o.maxStreams {
		h.streams.Add(-1)
		// 204 tells EventSource to stop retrying: the page stays, not live.
		w.WriteHeader(http.StatusNoContent)
		return nil, nil, false
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	return fl.Flush, func() { h.streams.Add(-1) }, true
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
	if _, err := h.tasks().GetTask(v.ctx(r), &pb.GetTaskRequest{TaskId: id}); err != nil {
		h.fail(w, r, v, err)
		return
	}
	st, err := h.tasks().WatchTask(v.ctx(r), &pb.WatchTaskRequest{TaskId: id})
	if err != nil {
		h.fail(w, r, v, err)
		return
	}
	flush, release, ok := h.stream(w)
	if !ok {
		return
	}
	defer release()
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
	flush, release, ok := h.stream(w)
	if !ok {
		return
	}
	defer release()
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
