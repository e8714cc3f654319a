// Package wire holds what the aggregator and the edge agent must agree on beyond
// the protobuf messages: NATS subjects, JetStream stream and bucket names, message
// IDs, size limits and the dense update encoding. Both sides import it, so they
// never share code by importing each other. docs/PROTOCOL.md describes the flow.
package wire

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fleetlearn/fleetlearn/internal/ident"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Subjects and names. Everything lives under "fl." so one account export or
// permission rule covers the protocol.
const (
	// SubjectCheckIns is what servers subscribe to for check-ins: every
	// device checks in on its own subject, CheckInSubject(device), which its
	// NATS permissions let no other device publish on.
	SubjectCheckIns = "fl.checkin.*"
	// SubjectAnnounce carries RoundAnnouncement broadcasts.
	SubjectAnnounce = "fl.announce"
	// StreamReports is the JetStream stream holding update and evaluation reports
	// until their round commits, so a server crash loses none.
	StreamReports = "FL_REPORTS"
	// BlobBucket is the JetStream object store of model and module blobs, named
	// by the lowercase hex sha256 of their bytes.
	BlobBucket = "fl_blobs"
	// QueueServers is the queue group aggregator replicas share for check-ins.
	QueueServers = "fl-servers"
	// SubjectAuditCheckpoint carries each new signed audit checkpoint note, for witnesses.
	SubjectAuditCheckpoint = "fl.audit.checkpoint"
)

// Report subjects: fl.report.<task>.<round>.<device> and fl.eval.<task>.<round>.<device>;
// the chunks of reports too large for one message, fl.chunk.<task>.<round>.<device>.
var StreamSubjects = []string{"fl.report.>", "fl.eval.>", "fl.chunk.>"}

// Stored notices: the reports stream republishes the headers (not the
// payload) of every report it stores on SubjectStoredPrefix + the report's
// subject, so the server learns of reports for rounds that are not open
// without receiving each payload a second time.
const (
	SubjectStoredPrefix = "fl.stored."
	SubjectStored       = SubjectStoredPrefix + ">"
)

// Limits.
const (
	// MaxMessageBytes is the default NATS max_payload the server configures and
	// the largest report it accepts: 100k float32 parameters take 400 KB.
	MaxMessageBytes = 8 << 20
	// MaxTokenLen bounds task and device identifiers.
	MaxTokenLen = 64
)

// ErrToken reports an identifier that is not a safe NATS subject token.
var ErrToken = errors.New("wire: invalid identifier")

// ErrPayload reports a malformed dense update payload.
var ErrPayload = errors.New("wire: invalid payload")

// CheckToken accepts 1–64 characters of [A-Za-z0-9_-]: such identifiers can
// be embedded in subjects without wildcards or separators sneaking in.
func CheckToken(kind, s string) error {
	if s == "" || len(s) > MaxTokenLen {
		return fmt.Errorf("%w: %s %q must be 1-%d characters", ErrToken, kind, s, MaxTokenLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %s %q: character %q not allowed", ErrToken, kind, s, c)
		}
	}
	return nil
}

// CheckInSubject is where a device sends its CheckIn requests (reply:
// CheckInResponse). The subject, not the message body, names the device.
func CheckInSubject(device string) string { return "fl.checkin." + device }

// ParseCheckInSubject returns the device a check-in subject names.
func ParseCheckInSubject(subj string) (string, error) {
	device, ok := strings.CutPrefix(subj, "fl.checkin.")
	if !ok {
		return "", fmt.Errorf("%w: %q is not a check-in subject", ErrToken, subj)
	}
	if err := CheckToken("device", device); err != nil {
		return "", err
	}
	return device, nil
}

// SubjectFailures is what servers subscribe to for devices' PlanFailure
// requests: fl.failure.<task>.<round>.<device>.
const SubjectFailures = "fl.failure.>"

// FailureSubject is where a device reports that it could not carry out a plan.
func FailureSubject(task string, round uint64, device string) string {
	return "fl.failure." + task + "." + strconv.FormatUint(round, 10) + "." + device
}

// ParseFailureSubject splits fl.failure.<task>.<round>.<device>.
func ParseFailureSubject(subj string) (task string, round uint64, device string, err error) {
	rest, ok := strings.CutPrefix(subj, "fl.failure.")
	if !ok {
		return "", 0, "", fmt.Errorf("%w: %q is not a failure subject", ErrToken, subj)
	}
	return parseTaskRoundDevice(rest, subj)
}

// MaxFailureReason bounds the reason of a PlanFailure, in bytes.
const MaxFailureReason = 256

// FailureReason makes s fit a PlanFailure: invalid UTF-8 and control
// characters become U+FFFD and the result is cut, on a character boundary,
// to at most MaxFailureReason bytes. Devices send it; the server applies it
// again to whatever arrives.
func FailureReason(s string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		if unicode.IsControl(r) {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > MaxFailureReason {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// ReportSubject is where a device publishes its update report for a round.
func ReportSubject(task string, round uint64, device string) string {
	return "fl.report." + task + "." + strconv.FormatUint(round, 10) + "." + device
}

// EvalSubject is where a device publishes its evaluation report for a round.
func EvalSubject(task string, round uint64, device string) string {
	return "fl.eval." + task + "." + strconv.FormatUint(round, 10) + "." + device
}

// RoundFilters are the stream subject filters of all reports of one round.
func RoundFilters(task string, round uint64) []string {
	r := strconv.FormatUint(round, 10)
	return []string{"fl.report." + task + "." + r + ".*", "fl.eval." + task + "." + r + ".*"}
}

// TaskReportFilter matches the update reports of every round of task: an
// asynchronous task's buffer takes reports trained on the plans of earlier
// rounds.
func TaskReportFilter(task string) string { return "fl.report." + task + ".*.*" }

// TaskChunkFilter matches the chunks of every round of task.
func TaskChunkFilter(task string) string { return "fl.chunk." + task + ".*.*" }

// SubjectSecAggUp is what the server subscribes to for devices' SecAggUp
// requests: fl.secagg.up.<task>.<round>.<device>.
const SubjectSecAggUp = "fl.secagg.up.>"

// SecAggUpSubject is where a device sends its SecAgg stage messages.
func SecAggUpSubject(task string, round uint64, device string) string {
	return "fl.secagg.up." + task + "." + strconv.FormatUint(round, 10) + "." + device
}

// SecAggDownSubject is where the server sends a device its SecAgg replies.
func SecAggDownSubject(task string, round uint64, device string) string {
	return "fl.secagg.down." + task + "." + strconv.FormatUint(round, 10) + "." + device
}

// ParseSecAggUpSubject splits fl.secagg.up.<task>.<round>.<device>.
func ParseSecAggUpSubject(subj string) (task string, round uint64, device string, err error) {
	rest, ok := strings.CutPrefix(subj, "fl.secagg.up.")
	if !ok {
		return "", 0, "", fmt.Errorf("%w: %q is not a secagg subject", ErrToken, subj)
	}
	return parseTaskRoundDevice(rest, subj)
}

// ReceiptSubject is where the server tells a device the fate of its reports.
func ReceiptSubject(device string) string { return "fl.receipt." + device }

// EventsSubject carries a task's RoundEvents for watchers.
func EventsSubject(task string) string { return "fl.events." + task }

// MsgID is the JetStream de-duplication id of a report: a device's second
// report for the same round within the duplicate window is dropped by the stream.
func MsgID(kind, task string, round uint64, device string) string {
	return kind + "/" + task + "/" + strconv.FormatUint(round, 10) + "/" + device
}

// EncodeDense encodes float32 values little-endian.
func EncodeDense(v []float32) []byte { return AppendDense(make([]byte, 0, 4*len(v)), v) }

// AppendDense appends v's encoding to dst, so that a device can reuse one
// buffer for its update round after round.
func AppendDense(dst []byte, v []float32) []byte {
	n := len(dst)
	dst = slices.Grow(dst, 4*len(v))[:n+4*len(v)]
	b := dst[n:]
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return dst
}

// DecodeDense decodes exactly want float32 values and refuses non-finite ones.
func DecodeDense(b []byte, want int) ([]float32, error) { return DecodeDenseInto(nil, b, want) }

// DecodeDenseInto is DecodeDense over dst's storage when it is large enough,
// so that the server decodes a round's reports into one buffer.
func DecodeDenseInto(dst []float32, b []byte, want int) ([]float32, error) {
	if len(b) != 4*want {
		return nil, fmt.Errorf("%w: %d bytes for %d float32 values", ErrPayload, len(b), want)
	}
	v := slices.Grow(dst[:0], want)[:want]
	if i := decodeFinite(v, b); i >= 0 {
		return nil, fmt.Errorf("%w: value %d is %v", ErrPayload, i, v[i])
	}
	return v, nil
}

// SHA256 is the lowercase hex sha256 of b, the form every blob and payload
// hash takes on the wire.
func SHA256(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// RotationSeed is the seed of a round's randomized Hadamard rotation for
// distributed DP: the same for the server and every device of the round, and
// different across tasks and rounds.
func RotationSeed(task string, round, roundSeed uint64) [32]byte {
	h := sha256.New()
	h.Write([]byte("fleetlearn/dp rotation\x00"))
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], round)
	binary.BigEndian.PutUint64(b[8:], roundSeed)
	h.Write([]byte(task))
	h.Write([]byte{0})
	h.Write(b[:])
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// MaskedSHA256 is the payload hash of a masked update: SHA-256 of its values
// as little-endian uint32s.
func MaskedSHA256(m *pb.MaskedUpdate) string {
	b := make([]byte, 4*len(m.GetValues()))
	for i, v := range m.GetValues() {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return SHA256(b)
}

// MetricsSHA256 is the digest of a metrics map that an evaluation report's
// signature covers: the names in byte order, each as a uint32 big-endian
// length and its bytes followed by the value's float64 bits big-endian.
func MetricsSHA256(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	var b [8]byte
	for _, k := range keys {
		binary.BigEndian.PutUint32(b[:4], uint32(len(k)))
		h.Write(b[:4])
		h.Write([]byte(k))
		binary.BigEndian.PutUint64(b[:], math.Float64bits(m[k]))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// CheckSHA256 accepts a lowercase hex sha256.
func CheckSHA256(kind, s string) error {
	if !ident.IsSHA256(s) {
		return fmt.Errorf("%w: %s sha256 %q is not 64 lowercase hex digits", ErrToken, kind, s)
	}
	return nil
}

// DeviceSeed derives the per-device, per-round training seed from the round
// seed, so devices shuffle differently and a re-run is reproducible.
func DeviceSeed(roundSeed uint64, device string) uint64 {
	h := sha256.Sum256(append(binary.LittleEndian.AppendUint64(nil, roundSeed), device...))
	return binary.LittleEndian.Uint64(h[:8])
}

// ParseReportSubject splits fl.report|eval.<task>.<round>.<device>.
func ParseReportSubject(subj string) (task string, round uint64, device string, err error) {
	rest, ok := strings.CutPrefix(subj, "fl.report.")
	if !ok {
		rest, ok = strings.CutPrefix(subj, "fl.eval.")
	}
	if !ok {
		return "", 0, "", fmt.Errorf("%w: report subject %q", ErrToken, subj)
	}
	return parseTaskRoundDevice(rest, subj)
}

// parseTaskRoundDevice splits the <task>.<round>.<device> tail of subj.
func parseTaskRoundDevice(rest, subj string) (task string, round uint64, device string, err error) {
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return "", 0, "", fmt.Errorf("%w: subject %q", ErrToken, subj)
	}
	round, err = strconv.ParseUint(parts[1], 10, 64)
	if err != nil {
		return "", 0, "", fmt.Errorf("%w: subject %q: round: %v", ErrToken, subj, err)
	}
	// One spelling per round: "01" would escape the round's stream filter.
	if strconv.FormatUint(round, 10) != parts[1] {
		return "", 0, "", fmt.Errorf("%w: subject %q: round %q is not in canonical decimal", ErrToken, subj, parts[1])
	}
	if err := CheckToken("task", parts[0]); err != nil {
		return "", 0, "", err
	}
	if err := CheckToken("device", parts[2]); err != nil {
		return "", 0, "", err
	}
	return parts[0], round, parts[2], nil
}

// Chunked reports (docs/PROTOCOL.md, Chunked reports): a report larger than
// one message is stored as ReportChunk messages on the device's chunk
// subject, then a ReportManifest, marked by HeaderChunked, on the report
// subject under the report's message id.
const (
	// HeaderChunked marks a ReportManifest on a report subject; its value is
	// ChunkedV1.
	HeaderChunked = "Fl-Report-Chunked"
	ChunkedV1     = "1"
	// MaxReportChunks bounds the chunks of one report.
	MaxReportChunks = 4096
	// MinChunkBytes is the smallest chunk but the last a server accepts, so
	// that a report is never cut into tiny pieces (MaxReportChunks of them
	// carry at least 64 MiB; devices cut chunks of about 8 MiB).
	MinChunkBytes = 16 << 10
	// ChunkOverhead is what a chunk message adds to its data (envelope,
	// message id header), with room to spare: devices cut chunks of the
	// connection's max payload less this.
	ChunkOverhead = 16 << 10
)

// ChunkSubject is where a device stores the chunks of its report for a
// round; its NATS permissions let no other device publish there.
func ChunkSubject(task string, round uint64, device string) string {
	return "fl.chunk." + task + "." + strconv.FormatUint(round, 10) + "." + device
}

// ChunkFilter is the stream subject filter of all chunks of one round.
func ChunkFilter(task string, round uint64) string {
	return "fl.chunk." + task + "." + strconv.FormatUint(round, 10) + ".*"
}

// ParseChunkSubject splits fl.chunk.<task>.<round>.<device>.
func ParseChunkSubject(subj string) (task string, round uint64, device string, err error) {
	rest, ok := strings.CutPrefix(subj, "fl.chunk.")
	if !ok {
		return "", 0, "", fmt.Errorf("%w: %q is not a chunk subject", ErrToken, subj)
	}
	return parseTaskRoundDevice(rest, subj)
}

// IsChunkSubject reports whether subj is in the chunk namespace.
func IsChunkSubject(subj string) bool { return strings.HasPrefix(subj, "fl.chunk.") }

// ChunkMsgID is the de-duplication id of one chunk: a retry of the same
// chunk of the same report is dropped by the stream (and acknowledged with
// the first copy's sequence), while a different report of a later attempt
// gets ids of its own.
func ChunkMsgID(reportID, payloadSHA256 string, index int) string {
	return reportID + "/" + payloadSHA256 + "/" + strconv.Itoa(index)
}

// IsEvalSubject reports whether a report subject carries an evaluation report.
func IsEvalSubject(subj string) bool { return len(subj) > 8 && subj[:8] == "fl.eval." }

// DenseDecoder decodes dense float32 values that arrive in pieces, as
// strictly as DecodeDenseInto decodes them whole, and hands them on in
// order, a batch at a time. It holds one batch.
type DenseDecoder struct {
	want, got int
	carry     [4]byte
	nc        int
	out       []float32
	emit      func([]float32) error
}

// NewDenseDecoder returns a decoder of want values for emit (whose slice is
// reused after it returns).
func NewDenseDecoder(want int, emit func([]float32) error) *DenseDecoder {
	return &DenseDecoder{want: want, emit: emit}
}

const denseBatch = 4096

// Write decodes the next bytes.
func (d *DenseDecoder) Write(p []byte) error {
	if d.out == nil {
		d.out = make([]float32, 0, denseBatch)
	}
	for len(p) > 0 {
		if d.nc > 0 || len(p) < 4 {
			k := copy(d.carry[d.nc:], p)
			d.nc += k
			p = p[k:]
			if d.nc < 4 {
				return nil
			}
			if err := d.value(binary.LittleEndian.Uint32(d.carry[:])); err != nil {
				return err
			}
			d.nc = 0
			continue
		}
		// Whole values: a tight run, no call per value.
		k := min(len(p)/4, denseBatch-len(d.out), d.want-d.got)
		if k == 0 {
			if d.got == d.want {
				return fmt.Errorf("%w: more than %d float32 values", ErrPayload, d.want)
			}
			if err := d.flush(); err != nil {
				return err
			}
			continue
		}
		n := len(d.out)
		if bad := decodeFinite(d.out[n:n+k], p[:4*k]); bad >= 0 {
			return fmt.Errorf("%w: value %d is %v", ErrPayload, d.got+bad, math.Float32frombits(binary.LittleEndian.Uint32(p[4*bad:])))
		}
		d.out = d.out[:n+k]
		d.got += k
		p = p[4*k:]
		if len(d.out) == denseBatch {
			if err := d.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// decodeFinite decodes the little-endian float32s of src into dst (as many
// as dst holds) and returns the index of the first that is Inf or NaN, or
// -1. It tests all the values without a branch each: an all-ones exponent
// e is the one for which e + 2^23 carries into the sign bit.
func decodeFinite(dst []float32, src []byte) int {
	src = src[:4*len(dst)]
	var bad uint32
	j := 0
	for ; j+4 <= len(dst); j += 4 {
		s, d := src[4*j:4*j+16], dst[j:j+4]
		b0, b1 := binary.LittleEndian.Uint32(s[0:]), binary.LittleEndian.Uint32(s[4:])
		b2, b3 := binary.LittleEndian.Uint32(s[8:]), binary.LittleEndian.Uint32(s[12:])
		d[0], d[1], d[2], d[3] = math.Float32frombits(b0), math.Float32frombits(b1), math.Float32frombits(b2), math.Float32frombits(b3)
		bad |= (b0&0x7f800000 + 0x00800000) | (b1&0x7f800000 + 0x00800000) | (b2&0x7f800000 + 0x00800000) | (b3&0x7f800000 + 0x00800000)
	}
	for ; j < len(dst); j++ {
		bits := binary.LittleEndian.Uint32(src[4*j:])
		dst[j] = math.Float32frombits(bits)
		bad |= bits&0x7f800000 + 0x00800000
	}
	bad &= 0x80000000
	if bad == 0 {
		return -1
	}
	for j, v := range dst {
		if bits := math.Float32bits(v); bits&0x7f800000 == 0x7f800000 {
			return j
		}
	}
	return -1
}

func (d *DenseDecoder) value(bits uint32) error {
	if d.got == d.want {
		return fmt.Errorf("%w: more than %d float32 values", ErrPayload, d.want)
	}
	if bits&0x7f800000 == 0x7f800000 {
		return fmt.Errorf("%w: value %d is %v", ErrPayload, d.got, math.Float32frombits(bits))
	}
	d.out = append(d.out, math.Float32frombits(bits))
	d.got++
	if len(d.out) == denseBatch {
		return d.flush()
	}
	return nil
}

func (d *DenseDecoder) flush() error {
	if len(d.out) == 0 {
		return nil
	}
	err := d.emit(d.out)
	d.out = d.out[:0]
	return err
}

// Close checks that every value came, whole, and hands on the last ones.
func (d *DenseDecoder) Close() error {
	if d.nc != 0 || d.got != d.want {
		return fmt.Errorf("%w: %d float32 values and %d bytes, want %d values", ErrPayload, d.got, d.nc, d.want)
	}
	return d.flush()
}
