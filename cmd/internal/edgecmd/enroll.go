package edgecmd

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/edge"
)

const enrollLong = `enroll joins this device to an aggregator's fleet, once, before the agent
runs. It presents a single-use enrollment token (the operator mints it with
'fleetlearn device token') and the device's public key to the server's API,
over TLS verified with --ca: the server's <data-dir>/tls/ca.crt, copied to
the device.

The device key is created in --data-dir (device.nk) and never leaves it.
On success --data-dir also holds the NATS credentials (device.creds), the
NATS URL (nats-url), the CA (ca.pem), the trusted module publishers
(publishers.jwks) and the device id; start the agent with the same
--data-dir. A failed enrollment leaves --data-dir as it was.

Exit status 3: the server refused the token (used, expired, or from another
server: ask the operator for a new one) or the device key (revoked, or
already enrolled).`

const enrollExamples = `  # the token in a file, as 'fleetlearn device token > token' wrote it
  fleetlearn-edge enroll --api aggregator.example.net:7070 --ca ca.crt --token-file token \
    --data-dir /var/lib/fleetlearn-edge

  # the token on standard input, with a device id of your choosing
  fleetlearn-edge enroll --api 10.0.0.5:7070 --ca ca.crt --token-file - --device-id gw-17 --data-dir D < token`

func newEnrollCommand() *cobra.Command {
	var cfg edge.EnrollConfig
	var ca, tokenFile string
	cmd := &cobra.Command{
		Use:     "enroll --api HOST:PORT --ca FILE --token-file FILE [--data-dir DIR]",
		Short:   "Enroll this device with an aggregator (once, before the agent runs)",
		Long:    enrollLong,
		Example: enrollExamples,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case cfg.API == "":
				return usage("enroll: --api is required: the server's API address, HOST:7070")
			case ca == "":
				return usage("enroll: --ca is required: the server's <data-dir>/tls/ca.crt, copied to this device")
			case (cfg.Token == "") == (tokenFile == ""):
				return usage("enroll: give the enrollment token with --token-file FILE (or --token TOKEN), once")
			}
			if tokenFile != "" {
				tok, err := readToken(cmd.InOrStdin(), tokenFile)
				if err != nil {
					return err
				}
				cfg.Token = tok
			}
			pem, err := os.ReadFile(ca)
			if err != nil {
				return fmt.Errorf("enroll: --ca: %w", err)
			}
			cfg.CAPEM = pem
			e, err := edge.Enroll(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "enrolled as %s (key %s)", e.DeviceID, e.KeyID)
			if e.NATSURL != "" {
				fmt.Fprintf(w, ", NATS %s", e.NATSURL)
			}
			_, err = fmt.Fprintf(w, "; credentials in %s\nstart the agent with: fleetlearn-edge --data-dir %s --dataset DIR\n",
				cfg.DataDir, shellQuote(cfg.DataDir))
			return err
		},
	}
	fl := cmd.Flags()
	fl.SortFlags = false
	fl.StringVar(&cfg.API, "api", "", "the aggregator's gRPC API address, HOST:PORT (the server's --grpc-addr; port 7070 by default)")
	fl.StringVar(&ca, "ca", "", "the aggregator's CA certificate (PEM): the server's <data-dir>/tls/ca.crt")
	fl.StringVar(&tokenFile, "token-file", "", `file holding the single-use enrollment token from 'fleetlearn device token' ("-": standard input)`)
	fl.StringVar(&cfg.Token, "token", "", "the enrollment token itself (prefer --token-file: arguments are visible to other users)")
	fl.StringVar(&cfg.DataDir, "data-dir", "fleetlearn-edge", "directory for the device key, credentials and caches: the agent's --data-dir")
	fl.StringVar(&cfg.DeviceID, "device-id", "", "requested device id (default: the server assigns one)")
	return cmd
}

// readToken reads an enrollment token from path, or from stdin for "-".
func readToken(stdin io.Reader, path string) (string, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(stdin, 64<<10))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return "", fmt.Errorf("enroll: --token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", usage("enroll: --token-file %s is empty", path)
	}
	return tok, nil
}
