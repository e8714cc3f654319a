package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/identity"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
	"github.com/fleetlearn/fleetlearn/wasm/examples/embedded"
)

// maxSignatureBytes matches the API's limit on a module signature.
const maxSignatureBytes = 64 << 10

func newModuleCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "module",
		Short: "Register and inspect WASM update modules",
	}
	cmd.AddCommand(
		newModuleRegisterCommand(a),
		newModuleListCommand(a),
		newModuleGetCommand(a),
		newModuleKeygenCommand(),
		newModulePublisherJWKSCommand(),
		newModuleSignCommand(),
		newModuleExampleCommand(a),
	)
	return cmd
}

func newModuleRegisterCommand(a *app) *cobra.Command {
	var name, sigFile, keyFile string
	var abi uint32
	cmd := &cobra.Command{
		Use:   "register FILE.wasm --name NAME (--signing-key KEY | --signature FILE)",
		Short: "Upload a signed WASM update module and print its SHA-256",
		Long: "The server accepts a module only with a signature by a publisher key it trusts\n" +
			"(fleetlearn-server --module-publishers). --signing-key signs here with a publisher key\n" +
			"(fleetlearn module keygen); --signature uploads one made elsewhere (fleetlearn module sign).",
		Example: "  fleetlearn module register mlp.wasm --name mlp --signing-key publisher.pem\n" +
			"  fleetlearn module register mlp.wasm --name mlp --signature mlp.sig",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sigFile != "" && keyFile != "" {
				return fmt.Errorf("%w: --signature and --signing-key cannot be used together", ErrUsage)
			}
			sig, err := readSignature(sigFile)
			if err != nil {
				return fmt.Errorf("module register: %w", err)
			}
			file, err := openUpload(args[0])
			if err != nil {
				return fmt.Errorf("module register: %w", err)
			}
			defer file.f.Close()
			if err := checkWASMPrefix(file); err != nil {
				return fmt.Errorf("module register: %s: %w", args[0], err)
			}
			if keyFile != "" {
				if sig, err = signModuleSHA256(keyFile, name, file.sha256); err != nil {
					return fmt.Errorf("module register: %w", err)
				}
			}
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				mod, err := client.RegisterModule(ctx, apiv1.NewModuleServiceClient(conn), &pb.RegisterModuleHeader{
					Name: name, AbiVersion: abi, SizeBytes: uint64(file.size), Sha256: file.sha256, Signature: sig,
				}, file.f)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(cmd.OutOrStdout(), mod.GetRef().GetSha256())
				return err
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "module name, for display and audit (required)")
	cmd.Flags().Uint32Var(&abi, "abi", 0, "host ABI version the module declares; the server refuses the module if it declares another (default: read from the module)")
	cmd.Flags().StringVar(&sigFile, "signature", "", "file holding the publisher's signature (fleetlearn module sign)")
	cmd.Flags().StringVar(&keyFile, "signing-key", "", "publisher key (PEM) to sign the module with")
	cmd.MarkFlagRequired("name")
	return cmd
}

// signModuleSHA256 signs a module digest with the publisher key in keyFile,
// which must exist: a missing key is a typo, not a request for a new one.
func signModuleSHA256(keyFile, name, sha string) ([]byte, error) {
	key, err := readSigningKey(keyFile)
	if err != nil {
		return nil, err
	}
	p, err := identity.NewPublisher(key)
	if err != nil {
		return nil, err
	}
	sig, err := p.SignModuleSHA256(name, sha)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return []byte(sig), nil
}

func readSigningKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInput, err)
	}
	key, err := identity.ParseSigningKey(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInput, path, err)
	}
	return key, nil
}

func newModuleKeygenCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen KEY.pem",
		Short: "Create a module publisher key and print the JWK Set servers and devices trust",
		Long: "keygen writes a new Ed25519 publisher key (mode 0600) and prints its public JWK Set, for\n" +
			"fleetlearn-server --module-publishers. An existing key is kept and its set printed again.\n" +
			"Keep the key on the publisher's machine, never on the server.",
		Example: "  fleetlearn module keygen publisher.pem > publishers.jwks\n" +
			"  fleetlearn-server --data-dir fleetlearn-data --module-publishers publishers.jwks",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := identity.LoadOrCreateSigningKey(args[0])
			if err != nil {
				return fmt.Errorf("module keygen: %w", err)
			}
			return writeJWKS(cmd, key.Public().(ed25519.PublicKey))
		},
	}
}

func newModulePublisherJWKSCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "publisher-jwks KEY.pem...",
		Short: "Print the JWK Set of publisher keys, for fleetlearn-server --module-publishers",
		Long:  "Several keys make one set, which is how a publisher key is rotated: trust both, then drop the old one.",
		Example: "  fleetlearn module publisher-jwks old.pem new.pem > publishers.jwks   # while rotating\n" +
			"  fleetlearn module publisher-jwks new.pem > publishers.jwks            # once no module signed by old.pem is used",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var pubs []ed25519.PublicKey
			for _, path := range args {
				key, err := readSigningKey(path)
				if err != nil {
					return fmt.Errorf("module publisher-jwks: %w", err)
				}
				pubs = append(pubs, key.Public().(ed25519.PublicKey))
			}
			return writeJWKS(cmd, pubs...)
		},
	}
}

func writeJWKS(cmd *cobra.Command, pubs ...ed25519.PublicKey) error {
	jwks, err := identity.PublicJWKS(pubs...)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), string(jwks))
	return err
}

func newModuleSignCommand() *cobra.Command {
	var name, keyFile string
	cmd := &cobra.Command{
		Use:   "sign FILE.wasm --name NAME --signing-key KEY.pem",
		Short: "Print a publisher's signature over a module, for module register --signature",
		Example: "  fleetlearn module sign mlp.wasm --name mlp --signing-key publisher.pem > mlp.sig   # on the publisher's machine\n" +
			"  fleetlearn module register mlp.wasm --name mlp --signature mlp.sig               # by an operator",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			file, err := openUpload(args[0])
			if err != nil {
				return fmt.Errorf("module sign: %w", err)
			}
			defer file.f.Close()
			if err := checkWASMPrefix(file); err != nil {
				return fmt.Errorf("module sign: %s: %w", args[0], err)
			}
			sig, err := signModuleSHA256(keyFile, name, file.sha256)
			if err != nil {
				return fmt.Errorf("module sign: %w", err)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), string(sig))
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "module name, as it will be registered (required)")
	cmd.Flags().StringVar(&keyFile, "signing-key", "", "publisher key (PEM) (required)")
	cmd.MarkFlagRequired("name")
	cmd.MarkFlagRequired("signing-key")
	return cmd
}

// readSignature reads a compact JWS, which is text; surrounding whitespace
// from editors is dropped.
func readSignature(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSignatureBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSignatureBytes {
		return nil, fmt.Errorf("%w: signature %s is larger than %d bytes", ErrInput, path, maxSignatureBytes)
	}
	return bytes.TrimSpace(b), nil
}

// checkWASMPrefix catches the wrong file early by the WebAssembly magic
// number; the server compiles the module in full.
func checkWASMPrefix(l *localFile) error {
	var head [4]byte
	_, err := io.ReadFull(l.f, head[:])
	if _, serr := l.f.Seek(0, io.SeekStart); err == nil {
		err = serr
	}
	if err != nil || string(head[:]) != "\x00asm" {
		return fmt.Errorf("%w: not a WebAssembly binary", ErrInput)
	}
	return nil
}

func newModuleListCommand(a *app) *cobra.Command {
	var format, name string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List registered modules, newest first",
		Example: "  fleetlearn module list\n" +
			"  fleetlearn module list --name mlp -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				c := apiv1.NewModuleServiceClient(conn)
				modules, err := listAll(ctx, func(ctx context.Context, token string) ([]*pb.Module, string, error) {
					res, err := c.ListModules(ctx, &pb.ListModulesRequest{Name: name, PageToken: token})
					return res.GetModules(), res.GetNextPageToken(), err
				})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if format == formatJSON {
					return writeJSON(w, &pb.ListModulesResponse{Modules: modules})
				}
				t := newTable(w, "SHA256", "NAME", "ABI", "SIZE", "KEY", "CREATED")
				for _, m := range modules {
					r := m.GetRef()
					t.row(r.GetSha256(), r.GetName(), fmt.Sprint(r.GetAbiVersion()), byteSize(r.GetSizeBytes()),
						orDash(m.GetKeyId()), timeString(m.GetCreateTime()))
				}
				return t.flush()
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "only modules with this name")
	addFormatFlag(cmd, &format)
	return cmd
}

func newModuleGetCommand(a *app) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "get SHA256",
		Short: "Show one registered module",
		Example: "  sha=$(fleetlearn module register mlp.wasm --name mlp --signing-key publisher.pem)\n" +
			"  fleetlearn module get \"$sha\" -o json",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewModuleServiceClient(conn).GetModule(ctx, &pb.GetModuleRequest{Sha256: strings.ToLower(args[0])})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				m := res.GetModule()
				if format == formatJSON {
					return writeJSON(w, m)
				}
				r := m.GetRef()
				t := newTable(w)
				t.row("SHA256", r.GetSha256())
				t.row("NAME", r.GetName())
				t.row("ABI", fmt.Sprint(r.GetAbiVersion()))
				t.row("SIZE", fmt.Sprintf("%s (%d bytes)", byteSize(r.GetSizeBytes()), r.GetSizeBytes()))
				t.row("KEY", orDash(m.GetKeyId()))
				t.row("SIGNED", fmt.Sprint(len(m.GetSignature()) > 0))
				t.row("CREATED", timeString(m.GetCreateTime()))
				return t.flush()
			})
		},
	}
	addFormatFlag(cmd, &format)
	return cmd
}

func newModuleExampleCommand(a *app) *cobra.Command {
	var out string
	var force bool
	var names []string
	var list strings.Builder
	for _, m := range embedded.List() {
		names = append(names, m.Name)
		fmt.Fprintf(&list, "  %-8s %s\n", m.Name, m.Description)
	}
	cmd := &cobra.Command{
		Use:   "example [NAME] [-o FILE.wasm] [--force]",
		Short: "Write an example update module that ships inside fleetlearn, or list them",
		Long: "example writes one of the example update modules built into fleetlearn, the same bytes\n" +
			"that go generate builds reproducibly from wasm/examples, and prints its SHA-256 as\n" +
			"sha256sum does. Sign and upload it with module register. Without NAME it lists them:\n\n" +
			list.String(),
		Example:   "  fleetlearn module example mlp -o mlp.wasm\n  fleetlearn module register mlp.wasm --name mlp --signing-key publisher.pem",
		Args:      cobra.MaximumNArgs(1),
		ValidArgs: names,
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			if len(args) == 0 {
				if out != "" {
					return fmt.Errorf("%w: module example: -o needs a module NAME (one of %s)", ErrUsage, strings.Join(names, ", "))
				}
				t := newTable(w, "NAME", "SIZE", "SHA256", "DESCRIPTION")
				for _, m := range embedded.List() {
					t.row(m.Name, byteSize(uint64(m.Size)), m.SHA256, m.Description)
				}
				return t.flush()
			}
			m, err := embedded.Lookup(args[0])
			if err != nil {
				return fmt.Errorf("%w: module example: %w (available: %s)", ErrUsage, err, strings.Join(names, ", "))
			}
			code, err := m.Code()
			if err != nil {
				return fmt.Errorf("module example: %w", err)
			}
			path := out
			if path == "" {
				path = m.Name + ".wasm"
			}
			if path == "-" {
				if a.isTerminal(w) {
					return fmt.Errorf("%w: module example: not writing a binary module to a terminal; redirect it or pass -o FILE", ErrUsage)
				}
				_, err := w.Write(code)
				return err
			}
			if force {
				err = atomicfile.WriteFile(path, code, 0o644)
			} else if err = atomicfile.WriteNew(path, code, 0o644); errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%w: module example: %s exists; pass --force to replace it", ErrUsage, path)
			}
			if err != nil {
				return fmt.Errorf("module example: %w", err)
			}
			_, err = fmt.Fprintf(w, "%s  %s\n", m.SHA256, path)
			return err
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", `file to write ("-" for standard output); default NAME.wasm`)
	cmd.Flags().BoolVar(&force, "force", false, "replace the file if it exists")
	hideGlobalFlags(cmd)
	return cmd
}
