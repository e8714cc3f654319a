package demo

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/vbauerster/cupwriter"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// progress reports the demo's phases. On a terminal each phase is a bar
// redrawn in place (mpb), and what the demo prints while the phase runs
// appears above the bar; anywhere else (a pipe, a CI log, a test) every
// event is a plain line and nothing is redrawn.
type progress struct {
	w        io.Writer
	terminal bool
	cur      *phase
}

// phase is one stage of the demo with a known number of steps.
type phase struct {
	name  string
	total int
	done  int

	// Terminal only: the phase's own container, so that a finished phase's
	// bar stays on screen as an ordinary line above the next one.
	p   *mpb.Progress
	bar *mpb.Bar

	mu     sync.Mutex // status is read by mpb's render goroutine
	status string
}

// Bar layout: name, counter, bar, status, elapsed fit in 80 columns.
const (
	barNameWidth = 22
	barWidth     = 22
)

// start ends the running phase, if any, and starts one of total steps. In
// plain output it prints its description.
func (pr *progress) start(name string, total int, description string) *phase {
	pr.end()
	ph := &phase{name: name, total: max(total, 1)}
	pr.cur = ph
	if !pr.terminal {
		fmt.Fprintf(pr.w, "%s ...\n", description)
		return ph
	}
	ph.p = mpb.New(mpb.WithConsoleWriter(termWriter{cupwriter.New(pr.w, true)}), mpb.WithAutoRefresh())
	ph.bar = ph.p.AddBar(int64(ph.total), mpb.BarWidth(barWidth),
		mpb.PrependDecorators(
			decor.Name(name, decor.WC{W: barNameWidth, C: decor.DindentRight}),
			decor.CountersNoUnit("%d/%d", decor.WC{W: 8, C: decor.DindentRight}),
		),
		mpb.AppendDecorators(
			decor.Any(func(decor.Statistics) string { return ph.statusText() }, decor.WC{W: 18, C: decor.DindentRight}),
			decor.Elapsed(decor.ET_STYLE_GO, decor.WC{W: 6}),
		))
	return ph
}

// step marks one more step of the running phase done; status is shown
// beside the bar on a terminal.
func (ph *phase) step(status string) {
	ph.mu.Lock()
	ph.status = status
	ph.mu.Unlock()
	ph.done++
	if ph.bar != nil {
		ph.bar.SetCurrent(int64(min(ph.done, ph.total)))
	}
}

// status changes what the running phase shows beside its bar on a
// terminal, without a step.
func (pr *progress) status(s string) {
	if ph := pr.cur; ph != nil {
		ph.mu.Lock()
		ph.status = s
		ph.mu.Unlock()
	}
}

func (ph *phase) statusText() string {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	return ph.status
}

// end completes the running phase, if any: its bar is drawn full, or where
// it stopped if the demo failed part way, and stays on screen.
func (pr *progress) end() {
	ph := pr.cur
	if ph == nil {
		return
	}
	pr.cur = nil
	if ph.p == nil {
		return
	}
	if ph.done < ph.total {
		ph.bar.Abort(false)
	}
	ph.p.Wait()
}

// printf prints a line: above the running bar on a terminal, otherwise
// straight to the output.
func (pr *progress) printf(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	if pr.cur != nil && pr.cur.p != nil {
		pr.cur.p.Write([]byte(s))
		return
	}
	io.WriteString(pr.w, s)
}

// round reports a committed training round of the running phase.
func (pr *progress) round(r RoundResult) {
	ph := pr.cur
	if ph == nil {
		return
	}
	ph.step(fmt.Sprintf("accuracy %.2f%%", 100*r.Accuracy))
	line := fmt.Sprintf("round %2d/%d  accuracy %6.2f%%  loss %.4f  reports %d  dropped %d  %v",
		ph.done, ph.total, 100*r.Accuracy, r.Loss, r.Reports, r.Dropped, r.Elapsed.Round(10*time.Millisecond))
	if !pr.terminal {
		// A log has no bar to redraw: each line carries its own.
		const width = 20
		filled := min(ph.done, ph.total) * width / ph.total
		line = "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "] " + line
	}
	pr.printf("%s", line)
}

// termWriter is mpb's console writer for output the demo was told is a
// terminal. mpb draws nothing on a terminal that reports no size (a
// pseudo-terminal nobody sized) and treats a writer whose descriptor it
// cannot see as no terminal at all; both get a standard 80x24.
type termWriter struct{ *cupwriter.Writer }

func (termWriter) IsTerminal() bool { return true }

func (w termWriter) GetTermSize() (width, height int, err error) {
	if w.Writer.IsTerminal() {
		if width, height, err = w.Writer.GetTermSize(); err == nil && width > 0 && height > 0 {
			return width, height, nil
		}
	}
	return 80, 24, nil
}
