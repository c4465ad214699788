// A device plugin with fake devices, for the test cluster's GPU node: it registers each resource
// with the kubelet over the kubelet's v1beta1 DevicePlugin API, as NVIDIA's plugins do, so that
// the node's capacity, allocatable and the scheduler's accounting are the kubelet's own.
//
//	fake-device-plugin --dir KUBELET_ROOT/device-plugins nvidia.com/L40S=4 nvidia.com/NVIDIA_L40S-24Q=2
//
// A kubelet that starts again empties its device-plugin directory: each resource whose socket is
// gone serves again and registers again, as a real plugin must.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type resource struct {
	pluginapi.UnimplementedDevicePluginServer
	name    string
	devices []*pluginapi.Device
	socket  string
}

func (r *resource) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once: they never change health.
func (r *resource) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: r.devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// Allocate hands the container nothing but the IDs it was given, in an environment variable.
func (r *resource) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	response := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		response.ContainerResponses = append(response.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"FAKE_DEVICES_" + envName(r.name): strings.Join(container.DevicesIds, ",")},
		})
	}
	return response, nil
}

func envName(resourceName string) string {
	return strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' {
			return c - 'a' + 'A'
		}
		if (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') {
			return c
		}
		return '_'
	}, resourceName)
}

// serve listens on the resource's socket and registers it with the kubelet; the server it returns
// stops when the socket goes.
func (r *resource) serve(directory string) (*grpc.Server, error) {
	_ = os.Remove(r.socket)
	listener, err := net.Listen("unix", r.socket)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, r)
	go func() { _ = server.Serve(listener) }()
	kubelet, err := grpc.NewClient("unix://"+filepath.Join(directory, "kubelet.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		defer kubelet.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = pluginapi.NewRegistrationClient(kubelet).Register(ctx, &pluginapi.RegisterRequest{
			Version:      pluginapi.Version,
			Endpoint:     filepath.Base(r.socket),
			ResourceName: r.name,
			Options:      &pluginapi.DevicePluginOptions{},
		})
	}
	if err != nil {
		server.Stop()
		return nil, err
	}
	return server, nil
}

// keepRegistered serves the resource again whenever its socket is gone (a kubelet that started
// again removes every plugin's socket) or the registration failed.
func (r *resource) keepRegistered(directory string) {
	var server *grpc.Server
	for ; ; time.Sleep(time.Second) {
		if server != nil {
			if _, err := os.Stat(r.socket); err == nil {
				continue
			}
			server.Stop()
			log.Printf("%s: socket gone, registering again", r.name)
		}
		var err error
		if server, err = r.serve(directory); err != nil {
			log.Printf("%s: not registered yet: %v", r.name, err)
			continue
		}
		log.Printf("%s: registered %d devices", r.name, len(r.devices))
	}
}

func parse(argument string, directory string) (*resource, error) {
	name, count, found := strings.Cut(argument, "=")
	number, err := strconv.Atoi(count)
	if !found || err != nil || number < 1 || !strings.Contains(name, "/") {
		return nil, fmt.Errorf("%q: want DOMAIN/NAME=COUNT", argument)
	}
	r := &resource{name: name, socket: filepath.Join(directory, "fake-"+strings.ReplaceAll(name, "/", "_")+".sock")}
	for i := 0; i < number; i++ {
		r.devices = append(r.devices, &pluginapi.Device{ID: fmt.Sprintf("%s-%d", filepath.Base(name), i), Health: pluginapi.Healthy})
	}
	return r, nil
}

func main() {
	directory := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	flag.Parse()
	if flag.NArg() == 0 {
		log.Fatal("no resources: give DOMAIN/NAME=COUNT arguments")
	}
	for _, argument := range flag.Args() {
		r, err := parse(argument, *directory)
		if err != nil {
			log.Fatal(err)
		}
		go r.keepRegistered(*directory)
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
}
