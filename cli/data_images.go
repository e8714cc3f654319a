package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/data"
)

// maxImageSkipList bounds the skipped files the warning names.
const maxImageSkipList = 5

func newDataImagesCommand(_ *app) *cobra.Command {
	var (
		f    splitFlags
		size string
		gray bool
	)
	cmd := &cobra.Command{
		Use:   "images DIR --size WxH --devices N --out OUT",
		Short: "Split a folder of labelled images (one sub-folder per class) into device datasets",
		Long: "images reads DIR/CLASS/FILE: each sub-folder of DIR is one class, numbered in sorted name order\n" +
			"(OUT/" + classesFile + " lists them, line K naming class K), and its PNG, JPEG and GIF files (by\n" +
			"extension) are that class's examples. Each image is resized to --size with bilinear\n" +
			"interpolation; its features are the pixels scaled to [0, 1], channel-major: all of red, then\n" +
			"green, then blue, each plane row by row (one plane with --gray, the luma). Transparent pixels\n" +
			"count as black. Other files and deeper folders are skipped with a warning; a file that does\n" +
			"not decode is an error naming it.\n\n" +
			"The split is that of data csv without --key: --eval-fraction of the images to OUT/eval, the rest\n" +
			"across --devices by Dirichlet(--alpha) label skew, or IID with --alpha 0.\n\n" +
			fmt.Sprintf("Limits: %d images, %d MiB and %d megapixels per file, --size up to %dx%d.",
				data.DefaultMaxImages, data.DefaultMaxImageBytes>>20, data.DefaultMaxPixels>>20, data.MaxImageSide, data.MaxImageSide),
		Example: "  fleetlearn data images photos --size 32x32 --devices 5 --out datasets\n" +
			"  fleetlearn data images scans --size 28x28 --gray --devices 10 --alpha 0 --out datasets",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := parseSize(size)
			if err != nil {
				return err
			}
			o.Gray = gray
			if err := f.check(); err != nil {
				return err
			}
			in, err := readImages(cmd.ErrOrStderr(), args[0], o)
			if err != nil {
				return fmt.Errorf("data images: %w", err)
			}
			return f.split(cmd.OutOrStdout(), cmd.ErrOrStderr(), "data images", "images", in)
		},
	}
	f.bind(cmd)
	cmd.Flags().StringVar(&size, "size", "", "width and height every image is resized to, such as 32x32 (required)")
	cmd.Flags().BoolVar(&gray, "gray", false, "one feature per pixel, its luma, instead of red, green and blue")
	cmd.MarkFlagRequired("size")
	return cmd
}

// parseSize parses --size WxH.
func parseSize(s string) (data.ImageOptions, error) {
	ws, hs, ok := strings.Cut(strings.ToLower(s), "x")
	w, errW := strconv.Atoi(ws)
	h, errH := strconv.Atoi(hs)
	if !ok || errW != nil || errH != nil || w < 1 || h < 1 || w > data.MaxImageSide || h > data.MaxImageSide {
		return data.ImageOptions{}, fmt.Errorf("%w: --size %q must be WIDTHxHEIGHT, each between 1 and %d, such as 32x32", ErrUsage, s, data.MaxImageSide)
	}
	return data.ImageOptions{Width: w, Height: h}, nil
}

// readImages reads the image folder dir and warns of the files it skipped.
func readImages(warn io.Writer, dir string, o data.ImageOptions) (labelled, error) {
	res, err := data.ReadImageFolder(dir, o)
	if err != nil {
		return labelled{}, fromData(err)
	}
	if skipped := res.Skipped; len(skipped) > 0 {
		named := skipped[:min(len(skipped), maxImageSkipList)]
		more := ""
		if len(skipped) > len(named) {
			more = fmt.Sprintf(" and %d more", len(skipped)-len(named))
		}
		fmt.Fprintf(warn, "skipped %s (or folders) that are not images in a class folder: %s%s\n",
			plural(len(skipped), "file"), strings.Join(named, ", "), more)
	}
	return labelled{set: res.Dataset, classes: res.Classes, from: dir}, nil
}
