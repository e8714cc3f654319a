package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/sqldb"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/server/internal/backend"
)

// deviceSchema is the fleet registry: enrolled devices with their keys, and
// the ids of redeemed enrollment tokens. (Table devices holds what
// check-ins report, enrolled or not.)
const deviceSchema = `
CREATE TABLE IF NOT EXISTS enrolled_devices (
	id TEXT PRIMARY KEY,
	key_id TEXT NOT NULL UNIQUE,   -- nkey user public key; never enrolled twice, even after revocation
	fleet TEXT NOT NULL,
	grp TEXT NOT NULL DEFAULT '',
	attrs BLOB,
	token_id TEXT NOT NULL,        -- jti of the enrollment token redeemed
	enrolled_at INTEGER NOT NULL,
	revoked_at INTEGER NOT NULL DEFAULT 0,
	reason TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS enroll_tokens (
	jti TEXT PRIMARY KEY,
	expires INTEGER NOT NULL
);
`

// DeviceRow is an enrolled device.
type DeviceRow struct {
	ID    string
	KeyID string
	Fleet string
	Group string
	// Attrs are what the device reported at its latest check-in as the
	// coordinator wrote it, or at enrollment if it has not checked in
	// since: the examples it holds, its class and agent version arrive
	// with check-ins (an agent enrolls before it loads its data).
	Attrs    *pb.DeviceAttributes
	TokenID  string
	Enrolled time.Time
	Revoked  time.Time // zero while active
	Reason   string
	// LastSeen is the device's last check-in as the coordinator wrote it
	// (throttled, so up to a minute old); zero if it never checked in.
	LastSeen time.Time
}

// Proto renders the row for the API.
func (r *DeviceRow) Proto() *pb.Device {
	return &pb.Device{Id: r.ID, KeyId: r.KeyID, Fleet: r.Fleet, Group: r.Group, Attributes: r.Attrs,
		EnrollTime: tsProto(r.Enrolled), RevokeTime: tsProto(r.Revoked), RevokeReason: r.Reason,
		LastSeenTime: tsProto(r.LastSeen)}
}

const deviceCols = `id, key_id, fleet, grp, attrs, token_id, enrolled_at, revoked_at, reason`

// selectDevice reads deviceCols and the last-seen time and attributes,
// which live with the check-in sightings rather than the registry.
const selectDevice = deviceCols + `, COALESCE((SELECT s.last_seen FROM devices s WHERE s.id = enrolled_devices.id), 0),
	(SELECT s.attrs FROM devices s WHERE s.id = enrolled_devices.id)`

func scanDevice(sc interface{ Scan(...any) error }, extra ...any) (*DeviceRow, error) {
	var (
		r        DeviceRow
		attrs    []byte
		enrolled int64
		revoked  int64
		seen     int64
		checkIn  []byte
	)
	if err := sc.Scan(append(extra, &r.ID, &r.KeyID, &r.Fleet, &r.Group, &attrs, &r.TokenID, &enrolled, &revoked, &r.Reason,
		&seen, &checkIn)...); err != nil {
		return nil, err
	}
	if len(checkIn) > 0 {
		attrs = checkIn
	}
	if len(attrs) > 0 {
		r.Attrs = &pb.DeviceAttributes{}
		if err := proto.Unmarshal(attrs, r.Attrs); err != nil {
			return nil, fmt.Errorf("store: device %s attributes: %w", r.ID, err)
		}
	}
	r.Enrolled, r.Revoked, r.LastSeen = fromTS(enrolled), fromTS(revoked), fromTS(seen)
	return &r, nil
}

// InsertDevice enrolls a device. An id or key already in the registry is
// ErrExists.
func (s *Store) InsertDevice(ctx context.Context, r *DeviceRow) error {
	var attrs []byte
	if r.Attrs != nil {
		b, err := proto.Marshal(r.Attrs)
		if err != nil {
			return fmt.Errorf("store: device attributes: %w", err)
		}
		attrs = b
	}
	_, err := s.exec(ctx, `INSERT INTO enrolled_devices (`+deviceCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.ID, r.KeyID, r.Fleet, r.Group, attrs, r.TokenID, ts(r.Enrolled), ts(r.Revoked), r.Reason)
	if sqldb.IsUniqueViolation(err) {
		// Which of the two: the key, if a row holds it (the same device
		// enrolling twice is refused for its key first).
		var n int
		if qerr := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM enrolled_devices WHERE key_id = ?`, r.KeyID).Scan(&n); qerr == nil && n > 0 {
			return fmt.Errorf("key %s is already enrolled: %w", r.KeyID, backend.ErrExists)
		}
		return fmt.Errorf("device %s is already enrolled: %w", r.ID, backend.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("store: insert device: %w", err)
	}
	return nil
}

// Device loads an enrolled device by id.
func (s *Store) Device(ctx context.Context, id string) (*DeviceRow, error) {
	r, err := scanDevice(s.hot.device.QueryRowContext(ctx, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("device %q: %w", id, backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: device: %w", err)
	}
	return r, nil
}

// DeviceByKey loads an enrolled device by its key id.
func (s *Store) DeviceByKey(ctx context.Context, keyID string) (*DeviceRow, error) {
	return s.device(ctx, "key_id", keyID)
}

func (s *Store) device(ctx context.Context, col, v string) (*DeviceRow, error) {
	r, err := scanDevice(s.db.QueryRowContext(ctx, `SELECT `+selectDevice+` FROM enrolled_devices WHERE `+col+` = ?`, v))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("device %q: %w", v, backend.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: device: %w", err)
	}
	return r, nil
}

// Devices lists enrolled devices in enrollment order after the cursor (a
// row id; 0 starts at the first) and returns the last row id listed.
func (s *Store) Devices(ctx context.Context, includeRevoked bool, afterRowID int64, limit int) ([]*DeviceRow, int64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT rowid, `+selectDevice+` FROM enrolled_devices
		WHERE rowid > ? AND (? OR revoked_at = 0) ORDER BY rowid LIMIT ?`, afterRowID, includeRevoked, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("store: devices: %w", err)
	}
	defer rows.Close()
	var out []*DeviceRow
	var last int64
	for rows.Next() {
		r, err := scanDevice(rows, &last)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, r)
	}
	return out, last, rows.Err()
}

// RevokeDevice marks a device revoked at at. Revoking a revoked device is
// ErrPrecondition.
func (s *Store) RevokeDevice(ctx context.Context, id, reason string, at time.Time) (*DeviceRow, error) {
	res, err := s.exec(ctx, `UPDATE enrolled_devices SET revoked_at = ?, reason = ? WHERE id = ? AND revoked_at = 0`,
		ts(at), reason, id)
	if err != nil {
		return nil, fmt.Errorf("store: revoke device: %w", err)
	}
	r, err := s.Device(ctx, id)
	if err != nil {
		return nil, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, fmt.Errorf("device %s was revoked at %s: %w", id, r.Revoked.Format(time.RFC3339), backend.ErrPrecondition)
	}
	return r, nil
}

// Revocations lists every revoked device key, for the NATS account JWT.
func (s *Store) Revocations(ctx context.Context) ([]identity.Revocation, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT key_id, revoked_at FROM enrolled_devices WHERE revoked_at != 0 ORDER BY rowid`)
	if err != nil {
		return nil, fmt.Errorf("store: revocations: %w", err)
	}
	defer rows.Close()
	var out []identity.Revocation
	for rows.Next() {
		var key string
		var at int64
		if err := rows.Scan(&key, &at); err != nil {
			return nil, err
		}
		out = append(out, identity.Revocation{UserKey: key, At: fromTS(at)})
	}
	return out, rows.Err()
}

// UsedTokens is the database's record of redeemed enrollment tokens, an
// identity.UsedTokens: a restart does not make a token usable again.
type UsedTokens struct {
	s      *Store
	now    func() time.Time
	leeway time.Duration
}

var _ identity.UsedTokens = (*UsedTokens)(nil)

// UsedTokens records redemptions in s, forgetting those whose token expired
// more than leeway (the verifier's) before now.
func (s *Store) UsedTokens(now func() time.Time, leeway time.Duration) *UsedTokens {
	return &UsedTokens{s: s, now: now, leeway: leeway}
}

// Claim implements identity.UsedTokens.
func (u *UsedTokens) Claim(ctx context.Context, jti string, exp time.Time) error {
	var claimed bool
	err := u.s.Tx(ctx, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM enroll_tokens WHERE expires < ?`, ts(u.now().Add(-u.leeway))); err != nil {
			return fmt.Errorf("store: prune enrollment tokens: %w", err)
		}
		res, err := tx.ExecContext(ctx, `INSERT INTO enroll_tokens (jti, expires) VALUES (?, ?) ON CONFLICT(jti) DO NOTHING`,
			jti, ts(exp))
		if err != nil {
			return fmt.Errorf("store: claim enrollment token: %w", err)
		}
		n, _ := res.RowsAffected()
		claimed = n == 1
		return nil
	})
	if err != nil {
		return err
	}
	if !claimed {
		return identity.ErrTokenReused
	}
	return nil
}

// Len is the number of redemptions on record.
func (u *UsedTokens) Len(ctx context.Context) (int, error) {
	var n int
	err := u.s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM enroll_tokens`).Scan(&n)
	return n, err
}

// FleetSize counts the devices that could take a seat in a round: enrolled
// ones that are not revoked, and of the devices that checked in at or after
// since, those not revoked (only enrolled ones, with enrolledOnly).
func (s *Store) FleetSize(ctx context.Context, since time.Time, enrolledOnly bool) (enrolled, seen int, err error) {
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM enrolled_devices WHERE revoked_at = 0`).Scan(&enrolled); err != nil {
		return 0, 0, fmt.Errorf("store: fleet size: %w", err)
	}
	q := `SELECT COUNT(*) FROM devices d WHERE d.last_seen >= ?
		AND NOT EXISTS (SELECT 1 FROM enrolled_devices e WHERE e.id = d.id AND e.revoked_at != 0)`
	if enrolledOnly {
		q = `SELECT COUNT(*) FROM devices d JOIN enrolled_devices e ON e.id = d.id WHERE d.last_seen >= ? AND e.revoked_at = 0`
	}
	if err := s.db.QueryRowContext(ctx, q, ts(since)).Scan(&seen); err != nil {
		return 0, 0, fmt.Errorf("store: fleet size: %w", err)
	}
	return enrolled, seen, nil
}
