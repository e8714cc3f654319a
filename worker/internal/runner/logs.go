package runner

import (
	"bytes"
	"sync"
)

// Stream names the output a line came from.
type Stream int

const (
	Stdout Stream = iota + 1
	Stderr
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	}
	return "unknown"
}

// logSink is shared by a rank's two output streams: one lock serialises the
// tail and the line callback, so callers never see concurrent calls.
type logSink struct {
	mu      sync.Mutex
	ring    []byte // fixed capacity; the tail of both streams interleaved
	pos     int    // next write position in ring
	full    bool   // ring has wrapped
	total   int64  // bytes seen on both streams
	onLine  func(Stream, string)
	maxLine int
}

func newLogSink(tailBytes, maxLine int, onLine func(Stream, string)) *logSink {
	return &logSink{ring: make([]byte, tailBytes), onLine: onLine, maxLine: maxLine}
}

// tail returns a copy of the retained bytes, oldest first.
func (l *logSink) tail() (b []byte, total int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.full {
		return append([]byte(nil), l.ring[:l.pos]...), l.total
	}
	b = make([]byte, 0, len(l.ring))
	b = append(b, l.ring[l.pos:]...)
	return append(b, l.ring[:l.pos]...), l.total
}

func (l *logSink) keep(p []byte) {
	l.total += int64(len(p))
	n := len(l.ring)
	if n == 0 {
		return
	}
	if len(p) >= n {
		copy(l.ring, p[len(p)-n:])
		l.pos, l.full = 0, true
		return
	}
	k := copy(l.ring[l.pos:], p)
	if k < len(p) {
		copy(l.ring, p[k:])
		l.full = true
	}
	l.pos = (l.pos + len(p)) % n
	if l.pos == 0 && len(p) > 0 {
		l.full = true
	}
}

// streamWriter splits one stream into lines for the callback. Its partial
// line is bounded by maxLine: a longer line is delivered in maxLine pieces,
// so a script that never writes a newline cannot grow it.
type streamWriter struct {
	sink    *logSink
	stream  Stream
	partial []byte
}

func (w *streamWriter) Write(p []byte) (int, error) {
	s := w.sink
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keep(p)
	if s.onLine == nil {
		return len(p), nil
	}
	rest := p
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		room := s.maxLine - len(w.partial)
		switch {
		case i >= 0 && i <= room:
			w.emit(rest[:i])
			rest = rest[i+1:]
		case len(rest) < room:
			w.partial = append(w.partial, rest...)
			rest = nil
		default:
			w.emit(rest[:room])
			rest = rest[room:]
		}
	}
	return len(p), nil
}

// emit delivers partial+b as one line; the caller holds the lock.
func (w *streamWriter) emit(b []byte) {
	line := string(w.partial) + string(b)
	w.partial = w.partial[:0]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	w.sink.onLine(w.stream, line)
}

// flush delivers a final line that had no newline.
func (w *streamWriter) flush() {
	s := w.sink
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.onLine != nil && len(w.partial) > 0 {
		w.emit(nil)
	}
}
