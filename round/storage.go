package round

// Report storage quotas (docs/PROTOCOL.md, Storage quotas). Any enrolled
// device may store messages on its own report, evaluation and chunk
// subjects, and the stream keeps those of the open round until it closes.
// The server charges each stored message to the device and round its
// subject names: a device may keep at most the round's largest report plus
// StorageFraming. What goes beyond is purged and the device's reports are
// refused; the honest devices of the round are untouched. A retry that
// re-sends a report with other bytes names another payload digest in its
// chunks' ids, and the earlier attempt's chunks are purged rather than
// charged; chunks stored after the device's manifest are orphans of a retry
// and are deleted one by one.

const (
	// StorageFraming is what a chunked report stores beyond its bytes: each
	// chunk's fields (index, count, size, digest: under 128 bytes for the
	// most chunks a report may have) and the manifest naming their sequences.
	StorageFraming = 1 << 20
	// RepurgeBytes and RepurgeMsgs coalesce the purges of a device already
	// over its quota: one purge per this many bytes or messages stored.
	RepurgeBytes = 1 << 20
	RepurgeMsgs  = 256
)

// Stored is one message a device stored for the round.
type Stored struct {
	Chunk bool   // on the device's chunk subject (else its report or evaluation subject)
	Size  uint64 // bytes stored: payload and headers
	Set   string // a chunk's payload digest: which attempt it belongs to
}

// StoreAction is what a charge asks the server to do with the stream.
type StoreAction int

// The actions.
const (
	Keep          StoreAction = iota
	DeleteMsg                 // delete the message: an orphan chunk
	PurgeEarlier              // purge the device's chunks before this one: an abandoned attempt
	PurgeUnseated             // purge the chunk subject: the device holds no seat
	OverQuota                 // the device just went over: purge all it stored for the round, refuse it
	Repurge                   // already over: purge the subject it stored on since
)

// Storage is what one device has stored for the open round.
type Storage struct {
	reports  uint64 // bytes on its report and evaluation subjects
	set      string // payload digest of the chunks being stored
	setBytes uint64 // bytes of those chunks
	manifest bool   // a report is stored: later chunks are orphans
	over     bool
	since    uint64 // bytes stored since the last purge, once over
	sinceN   int
}

// Over reports whether the device went over its quota.
func (d *Storage) Over() bool { return d != nil && d.over }

// Charge adds message n to what the device stored and says what to do:
// quota is the most the device may keep for the round. seated says whether
// the device holds a seat in the round (unknown while the round loads:
// true); a chunk of a device without a seat is purged unread, since no
// manifest of its will be read.
func (d *Storage) Charge(n Stored, quota uint64, seated bool) StoreAction {
	if n.Chunk && !seated {
		return PurgeUnseated
	}
	if d.over {
		d.since += n.Size
		d.sinceN++
		if d.since >= RepurgeBytes || d.sinceN >= RepurgeMsgs {
			d.since, d.sinceN = 0, 0
			return Repurge
		}
		return Keep
	}
	act := Keep
	switch {
	case n.Chunk && d.manifest:
		return DeleteMsg
	case n.Chunk && n.Set != d.set:
		if d.setBytes > 0 {
			act = PurgeEarlier
		}
		d.set, d.setBytes = n.Set, n.Size
	case n.Chunk:
		d.setBytes += n.Size
	default:
		d.reports += n.Size
		d.manifest = true
	}
	if d.reports+d.setBytes > quota {
		d.over = true
		return OverQuota
	}
	return act
}
