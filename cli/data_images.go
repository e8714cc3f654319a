package cli

import (
	"bytes"
	"fmt"
	"image"
	_ "image/gif" // decoders image.Decode dispatches to
	_ "image/jpeg"
	_ "image/png"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/data"
)

// Bounds of what data images reads. The pixel bound is checked on the
// image's header (image.DecodeConfig) before it is decoded, so a small file
// declaring a huge image cannot exhaust memory.
const (
	maxImages        = 1 << 20
	maxImageBytes    = 32 << 20 // one file
	maxImagePixels   = 1 << 24  // width x height of one source image
	maxImageSide     = 512      // of --size
	maxImageSkipList = 5        // skipped files named in the warning
)

// imageExts are the file name extensions data images reads, lower case.
var imageExts = map[string]bool{".png": true, ".jpg": true, ".jpeg": true, ".gif": true}

// imageOptions is the shape images are resized to.
type imageOptions struct {
	width, height int
	gray          bool
}

// channels is the number of feature planes: 1 for --gray, else red, green
// and blue.
func (o imageOptions) channels() int {
	if o.gray {
		return 1
	}
	return 3
}

func (o imageOptions) dim() int { return o.channels() * o.width * o.height }

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
				maxImages, maxImageBytes>>20, maxImagePixels>>20, maxImageSide, maxImageSide),
		Example: "  fleetlearn data images photos --size 32x32 --devices 5 --out datasets\n" +
			"  fleetlearn data images scans --size 28x28 --gray --devices 10 --alpha 0 --out datasets",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := parseSize(size)
			if err != nil {
				return err
			}
			o.gray = gray
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
func parseSize(s string) (imageOptions, error) {
	ws, hs, ok := strings.Cut(strings.ToLower(s), "x")
	w, errW := strconv.Atoi(ws)
	h, errH := strconv.Atoi(hs)
	if !ok || errW != nil || errH != nil || w < 1 || h < 1 || w > maxImageSide || h > maxImageSide {
		return imageOptions{}, fmt.Errorf("%w: --size %q must be WIDTHxHEIGHT, each between 1 and %d, such as 32x32", ErrUsage, s, maxImageSide)
	}
	return imageOptions{width: w, height: h}, nil
}

// readImages reads DIR/CLASS/FILE into a labelled set, classes in sorted
// order of their folders and images in sorted order within each.
func readImages(warn io.Writer, dir string, o imageOptions) (labelled, error) {
	top, err := os.ReadDir(dir)
	if err != nil {
		return labelled{}, err
	}
	var classes, skipped []string
	for _, e := range top {
		switch {
		case strings.HasPrefix(e.Name(), "."):
		case e.IsDir():
			classes = append(classes, e.Name())
		default:
			skipped = append(skipped, filepath.Join(dir, e.Name()))
		}
	}
	if len(classes) < 2 {
		return labelled{}, fmt.Errorf("%w: %s has %d sub-folders: it needs one per class, at least two, each holding that class's images",
			ErrUsage, dir, len(classes))
	}
	if len(classes) > data.MaxClasses {
		return labelled{}, fmt.Errorf("%s: %d class folders, more than %d: %w", dir, len(classes), data.MaxClasses, ErrInput)
	}
	dim := o.dim()
	set := &data.Dataset{Dim: dim, NumClasses: len(classes)}
	for k, class := range classes {
		files, err := os.ReadDir(filepath.Join(dir, class))
		if err != nil {
			return labelled{}, err
		}
		for _, e := range files {
			path := filepath.Join(dir, class, e.Name())
			if strings.HasPrefix(e.Name(), ".") {
				continue
			}
			if !e.Type().IsRegular() || !imageExts[strings.ToLower(filepath.Ext(e.Name()))] {
				skipped = append(skipped, path)
				continue
			}
			if set.Len() == maxImages || (set.Len()+1)*dim > maxSplitValues {
				return labelled{}, fmt.Errorf("%s: more than %d images, or %d feature values, in all: %w", dir, maxImages, maxSplitValues, ErrInput)
			}
			n := len(set.Features)
			set.Features = append(set.Features, make([]float32, dim)...)
			if err := loadImage(set.Features[n:], path, o); err != nil {
				return labelled{}, err
			}
			set.Labels = append(set.Labels, uint8(k))
		}
	}
	if set.Len() == 0 {
		return labelled{}, fmt.Errorf("%w: the class folders of %s hold no .png, .jpg, .jpeg or .gif files", ErrUsage, dir)
	}
	if len(skipped) > 0 {
		named := skipped[:min(len(skipped), maxImageSkipList)]
		more := ""
		if len(skipped) > len(named) {
			more = fmt.Sprintf(" and %d more", len(skipped)-len(named))
		}
		fmt.Fprintf(warn, "skipped %s (or folders) that are not images in a class folder: %s%s\n",
			plural(len(skipped), "file"), strings.Join(named, ", "), more)
	}
	return labelled{set: set, classes: classes, from: dir}, nil
}

// loadImage decodes the image at path and writes its resized pixels to
// dst, which holds o.dim() values.
func loadImage(dst []float32, path string, o imageOptions) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > maxImageBytes {
		return fmt.Errorf("%s: %d bytes, more than %d: %w", path, fi.Size(), maxImageBytes, ErrInput)
	}
	b, err := io.ReadAll(io.LimitReader(fh, maxImageBytes+1))
	if err != nil {
		return err
	}
	if len(b) > maxImageBytes {
		return fmt.Errorf("%s: more than %d bytes: %w", path, maxImageBytes, ErrInput)
	}
	cfg, format, err := image.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: not a PNG, JPEG or GIF image (%v): %w", path, err, ErrInput)
	}
	if cfg.Width < 1 || cfg.Height < 1 || cfg.Width > maxImagePixels/max(cfg.Height, 1) {
		return fmt.Errorf("%s: %s of %dx%d pixels, more than %d megapixels or empty: %w",
			path, format, cfg.Width, cfg.Height, maxImagePixels>>20, ErrInput)
	}
	img, _, err := image.Decode(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: corrupt %s image (%v): %w", path, format, err, ErrInput)
	}
	if r := img.Bounds(); r.Dx() != cfg.Width || r.Dy() != cfg.Height {
		return fmt.Errorf("%s: %s decodes to %dx%d pixels, its header says %dx%d: %w",
			path, format, r.Dx(), r.Dy(), cfg.Width, cfg.Height, ErrInput)
	}
	resize(dst, img, o)
	return nil
}

// resize samples img at o's size with bilinear interpolation, pixel centres
// aligned and edges clamped, and writes channel-major values in [0, 1]. It
// reads four source pixels per output pixel, so its cost is that of the
// output, whatever the source's size.
func resize(dst []float32, img image.Image, o imageOptions) {
	r := img.Bounds()
	plane := o.width * o.height
	for y := range o.height {
		y0, y1, fy := bilinearAxis(y, o.height, r.Dy())
		for x := range o.width {
			x0, x1, fx := bilinearAxis(x, o.width, r.Dx())
			var rgb [3]float64
			for _, c := range [4]struct {
				x, y int
				w    float64
			}{{x0, y0, (1 - fx) * (1 - fy)}, {x1, y0, fx * (1 - fy)}, {x0, y1, (1 - fx) * fy}, {x1, y1, fx * fy}} {
				if c.w == 0 {
					continue
				}
				// RGBA is alpha-premultiplied: transparent pixels are black.
				pr, pg, pb, _ := img.At(r.Min.X+c.x, r.Min.Y+c.y).RGBA()
				rgb[0] += c.w * float64(pr) / 0xffff
				rgb[1] += c.w * float64(pg) / 0xffff
				rgb[2] += c.w * float64(pb) / 0xffff
			}
			i := y*o.width + x
			if o.gray {
				// ITU-R BT.601 luma, as image/color's GrayModel.
				dst[i] = unit(0.299*rgb[0] + 0.587*rgb[1] + 0.114*rgb[2])
				continue
			}
			for ch := range rgb {
				dst[ch*plane+i] = unit(rgb[ch])
			}
		}
	}
}

// bilinearAxis maps output index i of n onto a source axis of length src:
// the two neighbouring source indices and the weight of the second.
func bilinearAxis(i, n, src int) (i0, i1 int, f float64) {
	s := max((float64(i)+0.5)*float64(src)/float64(n)-0.5, 0)
	i0 = int(s)
	if i0 >= src-1 {
		return src - 1, src - 1, 0
	}
	return i0, i0 + 1, s - float64(i0)
}

// unit clamps rounding error so features stay within [0, 1].
func unit(v float64) float32 { return float32(min(max(v, 0), 1)) }
