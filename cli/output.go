package cli

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"unicode"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Output formats for -o.
const (
	formatTable = "table"
	formatJSON  = "json"
)

// addFormatFlag adds -o table|json to cmd.
func addFormatFlag(cmd *cobra.Command, format *string) {
	cmd.Flags().StringVarP(format, "output", "o", formatTable, "output format: table or json")
}

func checkFormat(format string) error {
	if format != formatTable && format != formatJSON {
		return fmt.Errorf("%w: output format %q (want table or json)", ErrUsage, format)
	}
	return nil
}

// writeJSON prints m as indented protojson with the proto field names, the
// names the API documentation uses.
func writeJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("json: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

// row writes one line. Cells often hold text from the server or from
// devices (reasons, names), so control characters in them are replaced:
// they could break the columns or reach the terminal.
func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = printable(c)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

// printable replaces control characters with U+FFFD.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return unicode.ReplacementChar
		}
		return r
	}, s)
}

func (t *table) flush() error { return t.tw.Flush() }

// enumName shortens a proto enum value name: TASK_STATE_RUNNING -> running.
func enumName(name, prefix string) string {
	s := strings.TrimPrefix(name, prefix)
	if s == "UNSPECIFIED" || s == "" {
		return "-"
	}
	return strings.ToLower(strings.ReplaceAll(s, "_", "-"))
}

func taskState(s pb.TaskState) string      { return enumName(s.String(), "TASK_STATE_") }
func roundState(s pb.RoundState) string    { return enumName(s.String(), "ROUND_STATE_") }
func roundKind(k pb.RoundKind) string      { return enumName(k.String(), "ROUND_KIND_") }
func eventType(t pb.RoundEventType) string { return enumName(t.String(), "ROUND_EVENT_TYPE_") }
func modelSource(s pb.ModelSource) string  { return enumName(s.String(), "MODEL_SOURCE_") }
func ruleName(r pb.AggregationRule) string { return enumName(r.String(), "AGGREGATION_RULE_") }

func timeString(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format("2006-01-02T15:04:05Z")
}

// orDash keeps empty table cells visible.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shortSHA abbreviates a digest for tables; -o json has it in full.
func shortSHA(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return orDash(s)
}

// byteSize formats a byte count with binary units.
func byteSize(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// metricsString formats metrics as name=value pairs sorted by name.
func metricsString(m *pb.Metrics) string {
	vals := m.GetValues()
	if len(vals) == 0 {
		return "-"
	}
	names := make([]string, 0, len(vals))
	for k := range vals {
		names = append(names, k)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = k + "=" + formatFloat(vals[k])
	}
	return strings.Join(parts, " ")
}

func formatFloat(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Sprint(v)
	}
	return fmt.Sprintf("%.4g", v)
}
