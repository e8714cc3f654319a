package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/data"
)

func newDataIDXCommand(_ *app) *cobra.Command {
	var f splitFlags
	cmd := &cobra.Command{
		Use:   "idx IMAGES LABELS --devices N --out DIR",
		Short: "Split an IDX image and label file pair (such as Fashion-MNIST) into device datasets",
		Long: "idx reads an IDX image file (unsigned bytes, rank 2 or more: examples x ...) and the IDX label\n" +
			"file (rank 1) that goes with it, gzip-compressed or not, in the format MNIST and Fashion-MNIST\n" +
			"are distributed in. Each example's features are its bytes scaled to [0, 1], in the file's\n" +
			"order (row-major), and its label is its class index; there are as many classes as the largest\n" +
			"label plus one. The split is that of data csv without --key: --eval-fraction of the examples to\n" +
			"DIR/eval, the rest across --devices by Dirichlet(--alpha) label skew, or IID with --alpha 0.",
		Example: "  fleetlearn data idx train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz --devices 10 --out fashion",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.check(); err != nil {
				return err
			}
			in, err := readIDXPair(args[0], args[1])
			if err != nil {
				return fmt.Errorf("data idx: %w", err)
			}
			return f.split(cmd.OutOrStdout(), cmd.ErrOrStderr(), "data idx", "idx", in)
		},
	}
	f.bind(cmd)
	return cmd
}

// readIDXPair reads an IDX image file and its label file into a labelled
// set, pixels scaled to [0, 1] as data.LoadMNIST scales MNIST's.
func readIDXPair(images, labels string) (labelled, error) {
	ldims, ls, err := readIDXPath(labels)
	if err != nil {
		return labelled{}, err
	}
	if len(ldims) != 1 {
		return labelled{}, fmt.Errorf("%s: dimensions %v: a label file has rank 1; were IMAGES and LABELS given in that order? %w", labels, ldims, ErrInput)
	}
	idims, px, err := readIDXPath(images)
	if err != nil {
		return labelled{}, err
	}
	if len(idims) < 2 {
		return labelled{}, fmt.Errorf("%s: dimensions %v: an image file has rank 2 or more; were IMAGES and LABELS given in that order? %w", images, idims, ErrInput)
	}
	if idims[0] != ldims[0] {
		return labelled{}, fmt.Errorf("%s holds %d examples but %s holds %d labels: %w", images, idims[0], labels, ldims[0], ErrInput)
	}
	if idims[0] == 0 || len(px) == 0 {
		return labelled{}, fmt.Errorf("%s holds no examples, or examples of no bytes: %w", images, ErrInput)
	}
	if len(px) > data.DefaultMaxFeatureValues {
		return labelled{}, fmt.Errorf("%s: %d values, more than %d: %w", images, len(px), data.DefaultMaxFeatureValues, ErrInput)
	}
	top := 0
	for _, l := range ls {
		top = max(top, int(l))
	}
	set := &data.Dataset{Features: make([]float32, len(px)), Labels: ls, Dim: len(px) / idims[0], NumClasses: top + 1}
	for i, p := range px {
		set.Features[i] = float32(p) / 255
	}
	return labelled{set: set, from: images}, nil
}

func readIDXPath(path string) ([]int, []byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer fh.Close()
	dims, b, err := data.ReadIDX(fh)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return dims, b, nil
}
