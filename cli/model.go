package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func newModelCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Import, export and inspect model versions (safetensors)",
		Example: "  fleetlearn model init --arch mlp:784,128,10 -o base.safetensors && fleetlearn model import base.safetensors --name mnist\n" +
			"  fleetlearn model list\n" +
			"  fleetlearn model lineage gocode-lora",
	}
	cmd.AddCommand(
		newModelImportCommand(a),
		newModelExportCommand(a),
		newModelListCommand(a),
		newModelGetCommand(a),
		newModelInitCommand(a),
		newModelLoRACommand(a),
		newModelLineageCommand(a),
	)
	return cmd
}

func newModelImportCommand(a *app) *cobra.Command {
	var name, parent, version, description string
	cmd := &cobra.Command{
		Use:   "import FILE.safetensors --name NAME",
		Short: "Upload a safetensors file as a new model version and print the version",
		Long: "import uploads a safetensors file and prints the version the server stored it under: the\n" +
			"sha256 of the file the server keeps, which is yours re-encoded with the server's lineage\n" +
			"metadata, so it differs from your file's sha256. It is also NAME@N, the N-th version of NAME\n" +
			"(fleetlearn model list), and NAME while it is the newest. Standard error says which hash is\n" +
			"which, with the content hash (tensor names, shapes and values), which import does not change.\n\n" +
			"--parent records the model this one was derived from (fine-tuned elsewhere, adapters added):\n" +
			"the server checks that it is registered and that this model keeps its tensors and shapes\n" +
			"(LoRA adapters aside), and model lineage then links the two.",
		Example: "  fleetlearn model import base.safetensors --name mnist\n" +
			"  fleetlearn model import lora.safetensors --name gocode-lora --parent gocode --description 'LoRA r=4'\n" +
			"  V=$(fleetlearn model import init.safetensors --name gocode-init)   # the version alone on standard output",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkModelName("--name", name); err != nil {
				return err
			}
			file, err := openUpload(args[0])
			if err != nil {
				return fmt.Errorf("model import: %w", err)
			}
			defer file.f.Close()
			if err := checkSafetensorsPrefix(file); err != nil {
				return fmt.Errorf("model import: %s: %w", args[0], err)
			}
			// The server checks the file in full and says what is wrong
			// with it; here reading it (a chunk at a time, whatever its
			// size) only gives the content hash.
			content := ""
			if sum, err := model.HashSafetensors(bufio.NewReaderSize(file.f, 1<<20), model.WithInputSize(file.size)); err == nil {
				content = hex.EncodeToString(sum[:])
			}
			if _, err := file.f.Seek(0, io.SeekStart); err != nil {
				return fmt.Errorf("model import: %w", err)
			}
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				c := apiv1.NewModelServiceClient(conn)
				parentVersion := ""
				if parent != "" {
					var err error
					if parentVersion, err = resolveModel(ctx, c, parent); err != nil {
						return fmt.Errorf("--parent: %w", err)
					}
				}
				m, err := client.ImportModel(ctx, c, &pb.ImportModelHeader{
					Name: name, Version: version, ParentVersion: parentVersion, Description: description,
					Sha256: file.sha256, SizeBytes: uint64(file.size),
				}, file.f)
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintln(cmd.OutOrStdout(), m.GetRef().GetVersion()); err != nil {
					return err
				}
				label, err := modelLabel(ctx, c, m)
				if err != nil || label == "" {
					label = name
				}
				w := cmd.ErrOrStderr()
				if parentVersion != "" {
					fmt.Fprintf(w, "imported %s as %s, derived from %s\n", args[0], label, parentVersion)
				} else {
					fmt.Fprintf(w, "imported %s as %s\n", args[0], label)
				}
				printModelHashes(w, m.GetRef().GetVersion(), file.sha256, content)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "model family name (required)")
	cmd.Flags().StringVar(&parent, "parent", "", "registered model this one was derived from: NAME, NAME@N or a sha256 (prefix); model lineage then links them")
	cmd.Flags().StringVar(&version, "version", "", "ignored: the server names every version by its sha256")
	cmd.Flags().MarkDeprecated("version", "the server names every version by its sha256; refer to it as NAME@N or NAME")
	cmd.Flags().StringVar(&description, "description", "", "free-form description")
	cmd.MarkFlagRequired("name")
	return cmd
}

// printModelHashes labels the hashes of one model that are known ("" for
// the others). They differ and are easy to confuse: a version is the sha256
// of the file the server stores, which carries the server's lineage
// metadata (parent, source), so importing a file gives a version other than
// the file's sha256; the content hash covers tensor names, shapes and values
// alone (model.Hash), so every copy of the model shares it, and it is what
// a pool rank's log prints as the model.
func printModelHashes(w io.Writer, version, fileSHA256, content string) {
	if version != "" {
		fmt.Fprintf(w, "  version      %s  the server's name for it: the sha256 of the file it stores, lineage metadata included\n", version)
	}
	if fileSHA256 != "" {
		fmt.Fprintf(w, "  file sha256  %s  of the file's bytes, lineage metadata included\n", fileSHA256)
	}
	if content != "" {
		fmt.Fprintf(w, "  content hash %s  of tensor names, shapes and values (and a seq: layer list) alone: the same in every copy; pool rank logs print it as \"model\"\n", content)
	}
}

// checkSafetensorsPrefix catches the wrong file early: a safetensors file
// starts with the little-endian length of a JSON header that fits the file.
// The server parses the file in full.
func checkSafetensorsPrefix(l *localFile) error {
	var head [9]byte
	n, err := io.ReadFull(l.f, head[:])
	if _, serr := l.f.Seek(0, io.SeekStart); err == nil {
		err = serr
	}
	if n < len(head) {
		return fmt.Errorf("%w: too short for safetensors", ErrInput)
	}
	if err != nil {
		return err
	}
	if hl := binary.LittleEndian.Uint64(head[:8]); hl > uint64(l.size-8) || head[8] != '{' {
		return fmt.Errorf("%w: not a safetensors file", ErrInput)
	}
	return nil
}

func newModelExportCommand(a *app) *cobra.Command {
	var (
		out   string
		merge bool
	)
	cmd := &cobra.Command{
		Use:   "export MODEL -o FILE",
		Short: "Download a model version to a safetensors file",
		Long: "export downloads MODEL: NAME (its newest version), NAME@N (its N-th), a\n" +
			"version's sha256, or 12 or more leading digits of one. With --merge-lora it writes\n" +
			"the model with its LoRA adapters folded into their weights (W + B·A) and removed,\n" +
			"as fleetlearn model lora merge does, after checking the download.",
		Example: "  fleetlearn model export ft -o final.safetensors   # the newest model task ft committed\n" +
			"  fleetlearn model export ft-lora --merge-lora -o merged.safetensors",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				c := apiv1.NewModelServiceClient(conn)
				version, err := resolveModel(ctx, c, args[0])
				if err != nil {
					return err
				}
				if merge {
					return exportMerged(ctx, cmd, c, version, out)
				}
				m, err := exportModel(ctx, c, version, out)
				if err != nil {
					return err
				}
				label, err := modelLabel(ctx, c, m)
				if err != nil || label == "" {
					label = m.GetRef().GetVersion()
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s -> %s (%s, file sha256 %s: the version)\n", label, out,
					byteSize(m.GetRef().GetSizeBytes()), m.GetRef().GetSha256())
				return err
			})
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write (required); it appears only once complete and verified")
	cmd.Flags().BoolVar(&merge, "merge-lora", false, "fold the model's LoRA adapters into their weights and drop them")
	cmd.MarkFlagRequired("output")
	return cmd
}

// exportMerged downloads version, verified, and writes it with its LoRA
// adapters merged.
func exportMerged(ctx context.Context, cmd *cobra.Command, c apiv1.ModelServiceClient, version, out string) error {
	_, raw, err := client.ExportModelBytes(ctx, c, version, 0)
	if err != nil {
		if errors.Is(err, client.ErrProtocol) {
			return fmt.Errorf("model export: %w: %v", ErrProtocol, err)
		}
		return err
	}
	m, err := model.ReadSafetensors(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("model export: %s: %w", version, err)
	}
	if len(train.LoRAParams(m)) == 0 {
		return fmt.Errorf("%w: model %s has no LoRA adapters; export it without --merge-lora", ErrUsage, version)
	}
	merged, err := train.MergeLoRA(m)
	if err != nil {
		return fmt.Errorf("model export: %w", err)
	}
	merged.Lineage = m.Lineage
	merged.Lineage.Source = "fleetlearn model export --merge-lora " + version
	return writeLoRAResult(cmd, out, merged, true, m)
}

// exportModel downloads version into path atomically, checking the bytes
// against the metadata the server sent first.
func exportModel(ctx context.Context, c apiv1.ModelServiceClient, version, path string) (*pb.Model, error) {
	f, err := atomicfile.Create(path, 0o644)
	if err != nil {
		return nil, fmt.Errorf("model export: %w", err)
	}
	defer f.Abort()
	m, err := client.ExportModel(ctx, c, version, f, 0)
	if err != nil {
		if errors.Is(err, client.ErrProtocol) {
			return nil, fmt.Errorf("model export: %w: %v", ErrProtocol, err)
		}
		return nil, err
	}
	if err := f.Commit(); err != nil {
		return nil, fmt.Errorf("model export: %w", err)
	}
	return m, nil
}

func newModelListCommand(a *app) *cobra.Command {
	var format, name string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List model versions, newest first, each as NAME@N and its version (sha256)",
		Example: "  fleetlearn model list\n" +
			"  fleetlearn model list --name gocode -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				c := apiv1.NewModelServiceClient(conn)
				models, err := listAll(ctx, func(ctx context.Context, token string) ([]*pb.Model, string, error) {
					res, err := c.ListModels(ctx, &pb.ListModelsRequest{Name: name, PageToken: token})
					return res.GetModels(), res.GetNextPageToken(), err
				})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if format == formatJSON {
					return writeJSON(w, &pb.ListModelsResponse{Models: models})
				}
				// Every version of each listed name is in the listing, so
				// each can be numbered.
				labels := modelLabels(models)
				t := newTable(w, "MODEL", "VERSION", "SOURCE", "SIZE", "PARAMS", "PARENT", "TASK", "ROUND", "CREATED")
				for _, m := range models {
					r := m.GetRef()
					round := "-"
					if m.GetRound() > 0 {
						round = fmt.Sprint(m.GetRound())
					}
					parent := labels[r.GetParentVersion()]
					if parent == "" {
						parent = shortSHA(r.GetParentVersion())
					}
					t.row(labels[r.GetVersion()], r.GetVersion(), modelSource(m.GetSource()), byteSize(r.GetSizeBytes()),
						fmt.Sprint(m.GetParameterCount()), orDash(parent), orDash(m.GetTaskId()),
						round, timeString(m.GetCreateTime()))
				}
				return t.flush()
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "only versions of this model family")
	addFormatFlag(cmd, &format)
	return cmd
}

func newModelGetCommand(a *app) *cobra.Command {
	var (
		format  string
		content bool
	)
	cmd := &cobra.Command{
		Use:   "get MODEL",
		Short: "Show one model version: NAME (the newest), NAME@N, or a sha256 (prefix)",
		Long: "get shows one model version. VERSION is the server's name for it, the sha256 of the file it\n" +
			"stores (SHA256, the same for every model the server keeps). --content-hash downloads the model\n" +
			"and adds its content hash: the hash of its tensor names, shapes and values (and a seq: layer list) alone, which a pool\n" +
			"rank's log prints as \"model\" and model init and model import print for a local file.",
		Example: "  fleetlearn model get gocode\n" +
			"  fleetlearn model get gocode@1 --content-hash   # match it with a pool rank's \"model\" line\n" +
			"  fleetlearn model get 3f2a9c41d0e7 -o json",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, content, func(ctx context.Context, conn *grpc.ClientConn) error {
				c := apiv1.NewModelServiceClient(conn)
				version, err := resolveModel(ctx, c, args[0])
				if err != nil {
					return err
				}
				res, err := c.GetModel(ctx, &pb.GetModelRequest{Version: version})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				m := res.GetModel()
				if format == formatJSON {
					return writeJSON(w, m)
				}
				hash := ""
				if content {
					_, raw, err := client.ExportModelBytes(ctx, c, version, 0)
					if err != nil {
						if errors.Is(err, client.ErrProtocol) {
							return fmt.Errorf("model get: %w: %v", ErrProtocol, err)
						}
						return err
					}
					mm, err := model.ReadSafetensors(bytes.NewReader(raw))
					if err != nil {
						return fmt.Errorf("model get: %s: %w", version, err)
					}
					hash = mm.HashHex()
				}
				label, err := modelLabel(ctx, c, m)
				if err != nil {
					return err
				}
				r := m.GetRef()
				t := newTable(w)
				t.row("MODEL", orDash(label))
				t.row("VERSION", r.GetVersion())
				t.row("SHA256", orDash(r.GetSha256()))
				if content {
					t.row("CONTENT HASH", hash)
				}
				t.row("NAME", m.GetName())
				t.row("SOURCE", modelSource(m.GetSource()))
				t.row("SIZE", fmt.Sprintf("%s (%d bytes)", byteSize(r.GetSizeBytes()), r.GetSizeBytes()))
				t.row("TENSORS", fmt.Sprint(m.GetTensorCount()))
				t.row("PARAMS", fmt.Sprint(m.GetParameterCount()))
				t.row("PARENT", orDash(r.GetParentVersion()))
				t.row("TASK", orDash(m.GetTaskId()))
				t.row("ROUND", fmt.Sprint(m.GetRound()))
				t.row("DESCRIPTION", orDash(m.GetDescription()))
				t.row("CREATED", timeString(m.GetCreateTime()))
				return t.flush()
			})
		},
	}
	addFormatFlag(cmd, &format)
	cmd.Flags().BoolVar(&content, "content-hash", false, "download the model and show its content hash (tensor names, shapes and values)")
	return cmd
}
