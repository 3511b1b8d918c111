"""The model and data of the PS examples: a small recommender on generated samples.

Sample `i` is user `i % USERS`, item `(i * 31) % ITEMS`, and a label the dot product of their embeddings and
their biases can learn, so the loss falls within a few hundred steps.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

USERS, ITEMS, DIM = 97, 53, 8


def features(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """User, item and label of sample `index` (a pure function: any incarnation makes the same ones)."""
    user = index % USERS
    item = (index * 31) % ITEMS
    label = tf.cast(user % 7 + item % 5 >= 5, tf.float32)
    return user, item, label


class Recommender(keras.Model):
    """Dot product of a user and an item embedding, plus a bias per user, per item and overall."""

    def __init__(self) -> None:
        super().__init__()
        self.users = keras.layers.Embedding(USERS, DIM, name="users")
        self.items = keras.layers.Embedding(ITEMS, DIM, name="items")
        self.user_bias = keras.layers.Embedding(USERS, 1, name="user_bias")
        self.item_bias = keras.layers.Embedding(ITEMS, 1, name="item_bias")
        self.bias = tf.Variable(0.0, name="bias")

    def call(self, inputs: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        user, item = inputs
        dot = tf.reduce_sum(self.users(user) * self.items(item), axis=-1)
        biases = tf.squeeze(self.user_bias(user), -1) + tf.squeeze(self.item_bias(item), -1)
        return dot + biases + self.bias
