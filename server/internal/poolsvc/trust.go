package poolsvc

import (
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/pool"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/metrics"
)

// principalKey names a pool-worker token: the subject it was minted for
// and its id, as a worker is bound to them.
type principalKey struct{ subject, tokenID string }

func keyOf(p identity.Principal) principalKey { return principalKey{p.Subject, p.TokenID} }

// strikeRec is a principal's no-start record (pool.Worker.Strikes).
type strikeRec struct {
	strikes int
	until   time.Time
}

// awaiting is a lease delivered to a worker whose rank the worker has not
// yet reported.
type awaiting struct {
	at     time.Time // delivered
	missed int       // heartbeats since that did not list the rank
}

// admitWorker refuses a registration over the principal's cap. Lost
// workers do not count: a machine whose agent died is released once the
// server declares it lost (HeartbeatsToLoss intervals after its last call).
func (s *Service) admitWorker(p identity.Principal) error {
	n := 0
	now := s.clk.Now()
	for _, w := range s.workers {
		// One past its loss deadline is dead, declared lost or not yet.
		if !w.lost && now.Before(w.lastSeen.Add(s.lossAfter())) && w.subject == p.Subject && w.tokenID == p.TokenID {
			n++
		}
	}
	if n < s.d.MaxWorkersPerPrincipal {
		return nil
	}
	s.d.Metrics.PoolRefused(metrics.PoolRefusedWorkersPerToken)
	s.log.Warn("pool worker registration refused: the token holds its cap of workers",
		"subject", p.Subject, "token", p.TokenID, "workers", n, "cap", s.d.MaxWorkersPerPrincipal)
	return errorf(codes.ResourceExhausted, "register worker: the token of %.64q holds %d live workers, the most one token may "+
		"(server setting --pool-max-workers-per-token): a stopped worker is released %s after its last call; "+
		"give each machine its own token (fleetlearn token mint --subject NAME --role pool-worker)",
		p.Subject, n, s.lossAfter())
}

// inheritStrikes hands a new worker its principal's no-start record.
func (s *Service) inheritStrikes(w *workerRT) {
	r, ok := s.strikes[principalKey{w.subject, w.tokenID}]
	if !ok {
		return
	}
	if err := s.sched.SetStrikes(w.rec.Id, r.strikes, r.until); err != nil {
		s.log.Error("pool worker strikes", "worker", w.rec.Id, "err", err)
	}
}

// delivered notes the leases a heartbeat answer carries to w: from now the
// worker must report their ranks.
func (s *Service) delivered(w *workerRT, ls []*pb.RankLease) {
	now := s.clk.Now()
	for _, l := range ls {
		k := rankAttempt{l.GetJobId(), l.GetAttempt(), l.GetRank()}
		if _, ok := w.awaiting[k]; !ok {
			w.awaiting[k] = &awaiting{at: now}
		}
	}
}

// reported notes that w reported the rank k of a current lease (a
// heartbeat listed it, or it exited): the worker started it, and the
// scheduler learns the capacity the worker demonstrated.
func (s *Service) reported(w *workerRT, rt *jobRT, k rankAttempt) {
	if _, ok := w.awaiting[k]; !ok {
		return
	}
	delete(w.awaiting, k)
	if rt.live {
		if err := s.sched.Started(rt.id(), w.rec.Id); err != nil {
			s.log.Warn("pool start not recorded", "job", rt.id(), "worker", w.rec.Id, "err", err)
		}
	}
}

// missed counts a heartbeat of w that did not list awaited ranks.
func (w *workerRT) missed(listed map[rankAttempt]bool) {
	for k, a := range w.awaiting {
		if !listed[k] {
			a.missed++
		}
	}
}

// current is the live job whose current attempt leased rank k to worker.
func (s *Service) current(k rankAttempt, worker string) *jobRT {
	rt := s.jobs[k.job]
	if rt == nil || !rt.live || rt.rec.Attempt != k.attempt || int(k.rank) >= len(rt.leases) {
		return nil
	}
	if le := rt.leases[k.rank]; le.worker != worker || le.exited {
		return nil
	}
	return rt
}

// startDeadline is the earliest time a delivered lease that a heartbeat
// has missed may be found unstarted; zero when there is none.
func (s *Service) startDeadline() time.Time {
	var next time.Time
	for _, w := range s.workers {
		if w.lost {
			continue
		}
		for _, a := range w.awaiting {
			// A lease not yet missed by a heartbeat becomes due at the
			// worker's next call, which runs the loop anyway.
			if a.missed == 0 {
				continue
			}
			if dl := a.at.Add(s.d.StartTimeout); next.IsZero() || dl.Before(next) {
				next = dl
			}
		}
	}
	return next
}

// checkStarts revokes leases whose worker kept calling without reporting
// their ranks for StartTimeout: the job is requeued (no restart charged)
// and the worker's claim is distrusted. A worker that stopped calling is
// left to the loss timeout.
func (s *Service) checkStarts() {
	now := s.clk.Now()
	ids := mapsKeys(s.workers)
	slices.Sort(ids)
	for _, id := range ids {
		w := s.workers[id]
		if w.lost {
			continue
		}
		var jobs []string
		for k, a := range w.awaiting {
			rt := s.current(k, id)
			if rt == nil {
				delete(w.awaiting, k) // its attempt ended
				continue
			}
			if a.missed > 0 && !now.Before(a.at.Add(s.d.StartTimeout)) && !slices.Contains(jobs, k.job) {
				jobs = append(jobs, k.job)
			}
		}
		slices.Sort(jobs)
		for _, job := range jobs {
			// Its other ranks here are revoked with it.
			for k := range w.awaiting {
				if k.job == job {
					delete(w.awaiting, k)
				}
			}
			s.noStart(w, s.jobs[job])
		}
	}
}

func (s *Service) noStart(w *workerRT, rt *jobRT) {
	detail := fmt.Sprintf("no rank of attempt %d reported within %s", rt.rec.Attempt, s.d.StartTimeout)
	d, err := s.sched.NoStart(rt.id(), w.rec.Id, detail)
	if err != nil {
		s.log.Error("pool no-start refused by the scheduler", "job", rt.id(), "worker", w.rec.Id, "err", err)
		return
	}
	s.d.Metrics.PoolRefused(metrics.PoolRefusedNoStart)
	for _, sw := range s.sched.Workers() {
		if sw.ID == w.rec.Id {
			s.strikes[principalKey{w.subject, w.tokenID}] = strikeRec{strikes: sw.Strikes, until: sw.DistrustedUntil}
			s.log.Warn("pool worker did not start its ranks: lease revoked, job requeued, worker distrusted",
				"worker", w.rec.Id, "subject", w.subject, "job", rt.id(), "strikes", sw.Strikes, "distrusted_until", sw.DistrustedUntil)
		}
	}
	s.execute([]pool.Decision{d})
}
