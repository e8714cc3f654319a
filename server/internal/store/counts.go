package store

import (
	"context"
	"fmt"
	"time"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// DeviceStates counts devices for the metrics: enrolled and seen as
// FleetSize counts them, and revoked ones.
func (s *Store) DeviceStates(ctx context.Context, since time.Time, enrolledOnly bool) (enrolled, seen, revoked int, err error) {
	if enrolled, seen, err = s.FleetSize(ctx, since, enrolledOnly); err != nil {
		return 0, 0, 0, err
	}
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM enrolled_devices WHERE revoked_at != 0`).Scan(&revoked); err != nil {
		return 0, 0, 0, fmt.Errorf("store: revoked devices: %w", err)
	}
	return enrolled, seen, revoked, nil
}

// TaskStates counts tasks by state.
func (s *Store) TaskStates(ctx context.Context) (map[pb.TaskState]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT state, COUNT(*) FROM tasks GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("store: task states: %w", err)
	}
	defer rows.Close()
	out := map[pb.TaskState]int{}
	for rows.Next() {
		var st int32
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("store: task states: %w", err)
		}
		out[pb.TaskState(st)] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: task states: %w", err)
	}
	return out, nil
}
