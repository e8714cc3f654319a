package cli

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func newModelCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "model",
		Short: "Import, export and inspect model versions (safetensors)",
	}
	cmd.AddCommand(
		newModelImportCommand(a),
		newModelExportCommand(a),
		newModelListCommand(a),
		newModelGetCommand(a),
	)
	return cmd
}

func newModelImportCommand(a *app) *cobra.Command {
	var name, parent, version, description string
	cmd := &cobra.Command{
		Use:   "import FILE.safetensors --name NAME",
		Short: "Upload a safetensors file as a new model version and print the version",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			file, err := openUpload(args[0])
			if err != nil {
				return fmt.Errorf("model import: %w", err)
			}
			defer file.f.Close()
			if err := checkSafetensorsPrefix(file); err != nil {
				return fmt.Errorf("model import: %s: %w", args[0], err)
			}
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				m, err := client.ImportModel(ctx, apiv1.NewModelServiceClient(conn), &pb.ImportModelHeader{
					Name: name, Version: version, ParentVersion: parent, Description: description,
					Sha256: file.sha256, SizeBytes: uint64(file.size),
				}, file.f)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), m.GetRef().GetVersion())
				return err
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "model family name (required)")
	cmd.Flags().StringVar(&parent, "parent", "", "version this model was derived from")
	cmd.Flags().StringVar(&version, "version", "", "version name to store it under (default: assigned by the server)")
	cmd.Flags().StringVar(&description, "description", "", "free-form description")
	cmd.MarkFlagRequired("name")
	return cmd
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
	var out string
	cmd := &cobra.Command{
		Use:   "export VERSION -o FILE",
		Short: "Download a model version to a safetensors file",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				m, err := exportModel(ctx, apiv1.NewModelServiceClient(conn), args[0], out)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s -> %s (%s, sha256 %s)\n", m.GetRef().GetVersion(), out,
					byteSize(m.GetRef().GetSizeBytes()), m.GetRef().GetSha256())
				return err
			})
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write (required); it appears only once complete and verified")
	cmd.MarkFlagRequired("output")
	return cmd
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
		Short: "List model versions, newest first",
		Args:  cobra.NoArgs,
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
				t := newTable(w, "VERSION", "NAME", "SOURCE", "SIZE", "PARAMS", "PARENT", "TASK", "ROUND", "CREATED")
				for _, m := range models {
					r := m.GetRef()
					round := "-"
					if m.GetRound() > 0 {
						round = fmt.Sprint(m.GetRound())
					}
					t.row(r.GetVersion(), m.GetName(), modelSource(m.GetSource()), byteSize(r.GetSizeBytes()),
						fmt.Sprint(m.GetParameterCount()), orDash(shortSHA(r.GetParentVersion())), orDash(m.GetTaskId()),
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
	var format string
	cmd := &cobra.Command{
		Use:   "get VERSION",
		Short: "Show one model version",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewModelServiceClient(conn).GetModel(ctx, &pb.GetModelRequest{Version: args[0]})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				m := res.GetModel()
				if format == formatJSON {
					return writeJSON(w, m)
				}
				r := m.GetRef()
				t := newTable(w)
				t.row("VERSION", r.GetVersion())
				t.row("SHA256", orDash(r.GetSha256()))
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
	return cmd
}
