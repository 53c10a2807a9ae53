package main

import (
	"net/url"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       any               `yaml:"build"`
		Ports       []string          `yaml:"ports"`
		Environment map[string]string `yaml:"environment"`
		DependsOn   map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
		Healthcheck *struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
	} `yaml:"services"`
}

// envVars lists the environment variables the run command reads.
func envVars(v reflect.Type, into map[string]bool) {
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Anonymous {
			envVars(f.Type, into)
			continue
		}
		if env := f.Tag.Get("env"); env != "" {
			into[env] = true
		}
	}
}

// TestDockerComposeAgreesWithTheRelay parses docker-compose.yml (it cannot
// be started here) and checks that its services, ports and environment
// match what the relay reads.
func TestDockerComposeAgreesWithTheRelay(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docker-compose.yml")
	require.NoError(t, err)
	var c composeFile
	require.NoError(t, yaml.Unmarshal(raw, &c))

	pg, ok := c.Services["postgres"]
	require.True(t, ok, "a postgres service")
	require.Contains(t, pg.Ports, "5432:5432")
	require.NotNil(t, pg.Healthcheck)
	rmq, ok := c.Services["rabbitmq"]
	require.True(t, ok, "a rabbitmq service")
	require.Contains(t, rmq.Image, "management", "RabbitMQ with the management UI")
	require.Contains(t, rmq.Ports, "5672:5672")
	require.Contains(t, rmq.Ports, "15672:15672")
	require.NotNil(t, rmq.Healthcheck)

	relay, ok := c.Services["outboxrelay"]
	require.True(t, ok, "an outboxrelay service")
	require.NotNil(t, relay.Build, "the relay is built from the repository")
	_, err = os.Stat("../../Dockerfile")
	require.NoError(t, err)
	require.Equal(t, "service_healthy", relay.DependsOn["postgres"].Condition)
	require.Equal(t, "service_healthy", relay.DependsOn["rabbitmq"].Condition)

	known := map[string]bool{}
	envVars(reflect.TypeOf(RunCmd{}), known)
	for k := range relay.Environment {
		require.True(t, known[k], "the relay reads no variable %s", k)
	}
	require.NotEqual(t, "false", relay.Environment["OUTBOX_MIGRATE"], "the relay migrates on start")

	db, err := url.Parse(relay.Environment["DATABASE_URL"])
	require.NoError(t, err)
	require.Equal(t, "postgres", db.Hostname())
	require.Equal(t, "5432", db.Port())
	require.Equal(t, pg.Environment["POSTGRES_USER"], db.User.Username())
	pw, _ := db.User.Password()
	require.Equal(t, pg.Environment["POSTGRES_PASSWORD"], pw)
	require.Equal(t, pg.Environment["POSTGRES_DB"], strings.TrimPrefix(db.Path, "/"))

	amqpURL, err := url.Parse(relay.Environment["AMQP_URL"])
	require.NoError(t, err)
	require.Equal(t, "rabbitmq", amqpURL.Hostname())
	require.Equal(t, "5672", amqpURL.Port())
}
