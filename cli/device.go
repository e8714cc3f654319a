package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

func newDeviceCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "device",
		Short: "Enroll, list and revoke devices",
		Long: "Devices join the fleet with a single-use enrollment token:\n\n" +
			"  fleetlearn device token --ttl 1h > token             # on the operator's machine\n" +
			"  fleetlearn-edge enroll --api HOST:7070 --ca ca.crt --token-file token --data-dir D   # on the device\n" +
			"  fleetlearn device revoke DEVICE_ID --reason lost     # when it is lost or compromised",
	}
	cmd.AddCommand(newDeviceTokenCommand(a), newDeviceListCommand(a), newDeviceRevokeCommand(a))
	return cmd
}

func newDeviceTokenCommand(a *app) *cobra.Command {
	var fleet, group, format string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "token [--fleet F] [--group G] [--ttl 24h]",
		Short: "Mint a single-use enrollment token and print it",
		Long: "The token lets one device installation join the fleet before it expires. It is a bearer\n" +
			"secret: hand it to the device over a channel you trust.",
		Example: "  fleetlearn device token --ttl 1h > token\n" +
			"  fleetlearn device token --group lab --ttl 30m -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			if ttl <= 0 {
				return fmt.Errorf("%w: --ttl must be positive", ErrUsage)
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewDeviceServiceClient(conn).CreateEnrollmentToken(ctx, &pb.CreateEnrollmentTokenRequest{
					Fleet: fleet, Group: group, Ttl: durationpb.New(ttl)})
				if err != nil {
					return err
				}
				if format == formatJSON {
					return writeJSON(cmd.OutOrStdout(), res)
				}
				if res.GetToken() == "" {
					return fmt.Errorf("%w: no token in the response", ErrProtocol)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "enrollment token %s for fleet %s expires %s\n", res.GetTokenId(),
					res.GetFleet(), timeString(res.GetExpireTime()))
				_, err = fmt.Fprintln(cmd.OutOrStdout(), res.GetToken())
				return err
			})
		},
	}
	cmd.Flags().StringVar(&fleet, "fleet", "", "fleet the device joins (default: the server's)")
	cmd.Flags().StringVar(&group, "group", "", "group within the fleet")
	cmd.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token stays valid (at most 7 days)")
	addFormatFlag(cmd, &format)
	return cmd
}

func newDeviceListCommand(a *app) *cobra.Command {
	var format string
	var all bool
	cmd := &cobra.Command{
		Use:   "list [--all]",
		Short: "List enrolled devices, oldest first",
		Example: "  fleetlearn device list\n" +
			"  fleetlearn device list --all -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				c := apiv1.NewDeviceServiceClient(conn)
				devices, err := listAll(ctx, func(ctx context.Context, token string) ([]*pb.Device, string, error) {
					res, err := c.ListDevices(ctx, &pb.ListDevicesRequest{PageToken: token, IncludeRevoked: all})
					return res.GetDevices(), res.GetNextPageToken(), err
				})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if format == formatJSON {
					return writeJSON(w, &pb.ListDevicesResponse{Devices: devices})
				}
				t := newTable(w, "ID", "FLEET", "GROUP", "CLASS", "KEY", "ENROLLED", "REVOKED")
				for _, d := range devices {
					revoked := "-"
					if d.GetRevokeTime() != nil {
						revoked = timeString(d.GetRevokeTime()) + " (" + d.GetRevokeReason() + ")"
					}
					t.row(d.GetId(), d.GetFleet(), orDash(d.GetGroup()), orDash(d.GetAttributes().GetDeviceClass()),
						d.GetKeyId(), timeString(d.GetEnrollTime()), revoked)
				}
				return t.flush()
			})
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "include revoked devices")
	addFormatFlag(cmd, &format)
	return cmd
}

func newDeviceRevokeCommand(a *app) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:     "revoke DEVICE_ID --reason TEXT",
		Short:   "Revoke a device: its NATS connections are cut and its key never enrolls again",
		Example: `  fleetlearn device revoke edge-017 --reason "reported stolen"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				res, err := apiv1.NewDeviceServiceClient(conn).RevokeDevice(ctx, &pb.RevokeDeviceRequest{
					DeviceId: args[0], Reason: reason})
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "revoked %s at %s\n", res.GetDevice().GetId(),
					timeString(res.GetDevice().GetRevokeTime()))
				return err
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log (required)")
	cmd.MarkFlagRequired("reason")
	return cmd
}
