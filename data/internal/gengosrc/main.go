// Command gengosrc builds the copy of the Go standard library's source that
// package data embeds (data.EmbeddedGoSource), so that `fleetlearn data
// gosrc` works on a machine without Go. It is run by `go generate ./data`
// from the repository and writes
//
//	embedded/gosrc/gosrc.tar.gz  the packages' text, as data.GoSource reads it
//	embedded/gosrc/LICENSE       GOROOT/LICENSE, the licence of that text
//	gosrcembed_gen.go            the Go version, the archive's digest and
//	                             the package table
//
// It reads the src directory of the Go installation that runs it ($GOROOT,
// which go generate sets) with data.GoSource's default bounds and keeps
// every public package (data.PublicGoPackage with the default buckets) and
// the first privatePackages private ones in path order: enough for the
// public pretraining set and for up to that many devices, which are the
// same packages `data gosrc --goroot` picks from that installation.
//
// The output is reproducible: the same Go release gives the same source,
// the tar headers carry no time, owner or mode of the machine, and the gzip
// stream has no name or time and a fixed level. Another Go release gives
// other text, which is why its version is recorded.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"go/format"
	"log"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"github.com/fleetlearn/fleetlearn/data"
)

// privatePackages is how many private packages the copy keeps after the
// public ones: the README's recipe uses 3 devices, the language-model demo
// 8, and 48 leave room for larger experiments within about 0.5 MB.
const privatePackages = 48

func main() {
	log.SetFlags(0)
	log.SetPrefix("gengosrc: ")
	dir := flag.String("dir", ".", "directory of package data")
	goroot := flag.String("goroot", "", "Go installation to read (default: $GOROOT, else go env GOROOT)")
	flag.Parse()
	if err := generate(*dir, *goroot); err != nil {
		log.Fatal(err)
	}
}

// pkgEntry is one package in the generated table.
type pkgEntry struct {
	Path      string
	Files     int
	Bytes     int
	Truncated bool
}

func generate(dir, goroot string) error {
	if goroot == "" {
		goroot = os.Getenv("GOROOT")
	}
	if goroot == "" {
		out, err := exec.Command("go", "env", "GOROOT").Output()
		if err != nil {
			return fmt.Errorf("go env GOROOT: %w; pass -goroot", err)
		}
		goroot = strings.TrimSpace(string(out))
	}
	version, err := goVersion(goroot)
	if err != nil {
		return err
	}
	license, err := os.ReadFile(filepath.Join(goroot, "LICENSE"))
	if err != nil {
		return fmt.Errorf("the licence of the source: %w", err)
	}
	src := filepath.Join(goroot, "src")
	pkgs, err := data.GoSource(src, data.GoSourceOptions{})
	if err != nil {
		return err
	}
	var keep []data.GoPackage
	private := 0
	for _, p := range pkgs {
		switch {
		case data.PublicGoPackage(p.Path, data.DefaultPublicBuckets):
			keep = append(keep, p)
		case private < privatePackages:
			keep = append(keep, p)
			private++
		}
	}
	if private < privatePackages {
		return fmt.Errorf("%s has %d private packages, want %d", src, private, privatePackages)
	}

	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	var table []pkgEntry
	for _, p := range keep {
		files, err := splitFiles(src, p)
		if err != nil {
			return err
		}
		for i, text := range files {
			hdr := &tar.Header{Typeflag: tar.TypeReg, Name: "src/" + p.Path + "/" + p.FileNames[i], Mode: 0o644,
				Size: int64(len(text)), ModTime: time.Unix(0, 0), Format: tar.FormatUSTAR}
			if err := tw.WriteHeader(hdr); err != nil {
				return fmt.Errorf("tar %s: %w", hdr.Name, err)
			}
			if _, err := tw.Write(text); err != nil {
				return err
			}
		}
		table = append(table, pkgEntry{Path: p.Path, Files: p.Files, Bytes: len(p.Text), Truncated: p.Truncated})
	}
	if err := tw.Close(); err != nil {
		return err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := zw.Write(tarBuf.Bytes()); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	sum := sha256.Sum256(tarBuf.Bytes())
	gen, err := render(version, hex.EncodeToString(sum[:]), tarBuf.Len(), table)
	if err != nil {
		return err
	}
	out := filepath.Join(dir, "embedded", "gosrc")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "gosrc.tar.gz"), gz.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "LICENSE"), license, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "gosrcembed_gen.go"), gen, 0o644)
}

// splitFiles cuts the package's text back into its files: each file
// contributed its whole content except perhaps the last, cut by the
// package's byte bound.
func splitFiles(src string, p data.GoPackage) ([][]byte, error) {
	if len(p.FileNames) != p.Files {
		return nil, fmt.Errorf("%s: %d file names for %d files", p.Path, len(p.FileNames), p.Files)
	}
	var out [][]byte
	rest := p.Text
	for i, name := range p.FileNames {
		b, err := os.ReadFile(filepath.Join(src, filepath.FromSlash(path.Join(p.Path, name))))
		if err != nil {
			return nil, err
		}
		n := len(b)
		if i == len(p.FileNames)-1 {
			n = len(rest)
		}
		if n > len(rest) || n > len(b) || !bytes.Equal(rest[:n], b[:n]) {
			return nil, fmt.Errorf("%s/%s does not hold what data.GoSource read from it", p.Path, name)
		}
		out = append(out, rest[:n])
		rest = rest[n:]
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%s: %d bytes of text after its files", p.Path, len(rest))
	}
	return out, nil
}

// goVersion reads the release of the installation from its VERSION file,
// which every Go distribution has; a development tree has none, and its
// source is not a release anyone could reproduce.
func goVersion(goroot string) (string, error) {
	b, err := os.ReadFile(filepath.Join(goroot, "VERSION"))
	if err != nil {
		return "", fmt.Errorf("%s is not a Go release (%w); run with a released Go", goroot, err)
	}
	v, _, _ := strings.Cut(string(b), "\n")
	if !strings.HasPrefix(v, "go") {
		return "", errors.New(goroot + "/VERSION does not start with a Go version")
	}
	return strings.TrimSpace(v), nil
}

var genTemplate = template.Must(template.New("").Parse(`// Code generated by go run ./internal/gengosrc; DO NOT EDIT.

package data

import _ "embed"

// EmbeddedGoVersion is the Go release whose standard library source
// EmbeddedGoSource holds.
const EmbeddedGoVersion = {{printf "%q" .Version}}

// The tar archive inside embedded/gosrc/gosrc.tar.gz.
const (
	embeddedGoTarSHA256 = {{printf "%q" .SHA256}}
	embeddedGoTarSize   = {{.Size}}
)

//go:embed embedded/gosrc/gosrc.tar.gz
var embeddedGoTarGz []byte

//go:embed embedded/gosrc/LICENSE
var embeddedGoLicense []byte

// embeddedGoPackages are the archive's packages in path order, as
// GoSource read them with the default bounds.
var embeddedGoPackages = []embeddedGoPackage{
{{- range .Packages}}
	{ {{- printf "%q" .Path}}, {{.Files}}, {{.Bytes}}, {{.Truncated -}} },
{{- end}}
}
`))

func render(version, sum string, size int, pkgs []pkgEntry) ([]byte, error) {
	var b bytes.Buffer
	if err := genTemplate.Execute(&b, struct {
		Version, SHA256 string
		Size            int
		Packages        []pkgEntry
	}{version, sum, size, pkgs}); err != nil {
		return nil, err
	}
	return format.Source(b.Bytes())
}
