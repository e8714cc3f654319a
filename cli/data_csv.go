package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/data"
)

func newDataCSVCommand(_ *app) *cobra.Command {
	var (
		f splitFlags
		o data.CSVOptions
	)
	cmd := &cobra.Command{
		Use:   "csv FILE --label COLUMN --devices N --out DIR",
		Short: "Split a CSV file into device datasets, plus a server evaluation set",
		Long: "csv reads a CSV file whose first row names the columns, one example a row. --label names the\n" +
			"column of classes: integers in [0, 255] are the class indices themselves, anything else is a\n" +
			"class name, numbered in sorted order; DIR/" + classesFile + " lists the classes, line K naming class K.\n" +
			"The features are the --features columns, in that order, else every other column whose first\n" +
			"row holds a number. Every feature must be a finite number.\n\n" +
			"--eval-fraction of the rows, a seeded sample, go to DIR/eval. With --key the rest is split\n" +
			"naturally: all rows with the same value in that column (say, a user id) go to one device, the\n" +
			"keys dealt largest first to the device with the fewest rows. Without it the rows are split as\n" +
			"data mnist splits MNIST: Dirichlet(--alpha) label skew, or IID with --alpha 0. The datasets go to\n" +
			"DIR/device-0, DIR/device-1, ... in the format of docs/DATASET.md; the output is a function of the\n" +
			"file, the flags and --seed.",
		Example: "  fleetlearn data csv people.csv --label outcome --key user_id --devices 10 --out datasets\n" +
			"  fleetlearn data csv iris.csv --label species --features sepal_length,sepal_width --devices 3 --alpha 0 --out iris",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkCSVColumns(o); err != nil {
				return err
			}
			if err := f.check(); err != nil {
				return err
			}
			in, err := readCSVFile(cmd.ErrOrStderr(), args[0], o)
			if err != nil {
				return fmt.Errorf("data csv: %w", err)
			}
			return f.split(cmd.OutOrStdout(), cmd.ErrOrStderr(), "data csv", "csv", in)
		},
	}
	f.bind(cmd)
	fl := cmd.Flags()
	fl.StringVar(&o.Label, "label", "", "column holding each row's class: a name, or an index in [0, 255] (required)")
	fl.StringSliceVar(&o.Features, "features", nil, "feature columns, in order (default: every other column whose first row is a number)")
	fl.StringVar(&o.Key, "key", "", "column grouping rows, such as a user id: each key's rows go whole to one device")
	cmd.MarkFlagRequired("label")
	return cmd
}

// checkCSVColumns refuses the column flags data.ReadCSV would, before the
// file is read and in the words of the flags.
func checkCSVColumns(o data.CSVOptions) error {
	if o.Label == "" {
		return fmt.Errorf("%w: --label must name the column of classes", ErrUsage)
	}
	if o.Key == o.Label {
		return fmt.Errorf("%w: --key and --label name the same column %q", ErrUsage, o.Key)
	}
	for i, c := range o.Features {
		if c == o.Label || (o.Key != "" && c == o.Key) || slices.Contains(o.Features[:i], c) {
			return fmt.Errorf("%w: --features names column %q twice, or as the label or key", ErrUsage, c)
		}
	}
	return nil
}

// readCSVFile reads the CSV file at path, rewording data.ReadCSV's errors
// about its options into the flags'.
func readCSVFile(warn io.Writer, path string, o data.CSVOptions) (labelled, error) {
	res, err := data.ReadCSVFile(path, o)
	var ce *data.CSVColumnError
	switch {
	case errors.As(err, &ce):
		return labelled{}, fmt.Errorf("%w: --%s %q: %s has no such column; its columns are %s",
			ErrUsage, ce.Option, ce.Column, ce.Name, strings.Join(quoteAll(ce.Header), ", "))
	case errors.Is(err, data.ErrNoFeatures):
		return labelled{}, fmt.Errorf("%w; name the feature columns with --features", fromData(err))
	case err != nil:
		return labelled{}, fromData(err)
	}
	if len(res.Skipped) > 0 {
		fmt.Fprintf(warn, "not features, as their first row is not a number: %s; name the feature columns with --features\n",
			strings.Join(quoteAll(res.Skipped), ", "))
	}
	return labelled{set: res.Dataset, classes: res.Classes, keys: res.Keys, keyName: o.Key, from: path}, nil
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strconv.Quote(s)
	}
	return out
}
